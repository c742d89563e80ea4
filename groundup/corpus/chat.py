"""Conversations generated from the embedded corpus, for supervised fine-tuning and its evaluation.

    for record in iter_chat(("math", "code", "text"), math_count=5000, seed=0):
        record["messages"]   # TRL's conversational format: [{"role": "user", ...}, {"role": "assistant", ...}]
        record["split"]      # "train" or "heldout" (5% of each source, chosen by a hash of the prompt)

- math: generated arithmetic and word problems (a seed apart from the pretraining corpus's) with a
  worked answer in the pretraining format, `<solution>\\nAnswer: N`, and the answer in `answer`, so
  exact match is checkable (strict: the `Answer:` line; lenient: the last number in the reply).
- code: Python standard-library functions asked for by their docstring's first paragraph and
  signature; the reply is the function's source.
- text: Shakespeare (modern-spelling editions): "Continue ROMEO's speech" with the speech's first
  two lines; the reply is the next lines of the speech.

Everything is seeded: the same arguments give the same conversations in the same order.
"""

from __future__ import annotations

import ast
import itertools
import random
import re
from typing import Iterable, Iterator

from groundup.corpus.math_problems import GENERATORS, OperandRandom
from groundup.corpus.shakespeare import iter_shakespeare
from groundup.corpus.stdlib_code import iter_stdlib_code
from groundup.data.hashing import document_score
from groundup.errors import ConfigError

CHAT_DOMAINS = ("math", "code", "text")
HELDOUT_FRACTION = 0.05
MATH_SEED_OFFSET = 7919  # chat problems come from another stream than the pretraining corpus's
SYSTEM_PROMPTS = ["", "", "Answer briefly.", "You are a careful assistant. Show your working."]
_SPEAKER = re.compile(r"^([A-Z][A-Za-z' ]{1,30})\.$")


def _split(prompt: str, seed: int) -> str:
    return "heldout" if is_heldout_prompt(prompt, seed) else "train"


def is_heldout_prompt(prompt: str, seed: int) -> bool:
    """Whether the chat data of `seed` holds this prompt out (by its hash: the same prompt, the same split).
    The pretraining corpus of the same seed leaves these math questions out, so held-out exact match
    is measured on questions no stage trained on."""
    return document_score(prompt, seed) < HELDOUT_FRACTION


def _record(rid: str, source: str, domain: str, messages: list[dict], seed: int, **extra) -> dict:
    prompt = messages[-2]["content"]
    return {"id": rid, "source": source, "domain": domain, "messages": messages, "split": _split(prompt, seed),
            **extra}


def math_chats(count: int, seed: int = 0, max_operand: int = 0) -> Iterator[dict]:
    rng = OperandRandom(seed + MATH_SEED_OFFSET, max_operand)
    for i in range(count):
        question, solution, answer = rng.choice(GENERATORS)(rng)
        system = rng.choice(SYSTEM_PROMPTS)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": question},
            {"role": "assistant", "content": f"{solution}\nAnswer: {answer}"}]
        yield _record(f"chat-math/{seed}/{i:07d}", "chat-math", "math", messages, seed, answer=str(answer))


def _functions(source: str) -> Iterator[tuple[str, str, str]]:
    """(signature, docstring summary, source) of top-level functions worth asking for."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    lines = source.splitlines(keepends=True)  # once per module: ast.get_source_segment splits it per call
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc or node.end_lineno is None or not 3 <= node.end_lineno - node.lineno <= 40:
            continue
        last = lines[node.end_lineno - 1].encode()[: node.end_col_offset].decode()  # offsets count UTF-8 bytes
        body = "".join(lines[node.lineno - 1 : node.end_lineno - 1]) + last
        summary = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
        if not 20 <= len(summary) <= 300:
            continue
        yield f"{node.name}({ast.unparse(node.args)})", summary, body


def code_chats(count: int, seed: int = 0) -> Iterator[dict]:
    n = 0
    for record in iter_stdlib_code():
        for signature, summary, body in _functions(record["text"]):
            prompt = f"Write a Python function `{signature}`: {summary}"
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": body}]
            yield _record(f"chat-code/{record['id']}:{signature.split('(')[0]}", "chat-code", "code", messages, seed)
            n += 1
            if n >= count:
                return


def _speeches(text: str) -> Iterator[tuple[str, list[str]]]:
    for block in text.split("\n\n"):
        lines = [line.strip() for line in block.strip().split("\n")]
        if len(lines) < 5:
            continue
        match = _SPEAKER.match(lines[0])
        # Speakers are "Romeo." or "Lady Capulet."; an all-capitals line opens the list of characters.
        if match and not match.group(1).isupper() and all(lines[1:]) and not any(x.isupper() for x in lines[1:]):
            yield match.group(1), lines[1:]


def text_chats(count: int, seed: int = 0) -> Iterator[dict]:
    rng = random.Random(seed)
    n = 0
    for work in iter_shakespeare():
        if work["edition"] != "modern":
            continue
        for speaker, lines in _speeches(work["text"]):
            prompt = f"Continue {speaker.upper()}'s speech:\n" + "\n".join(lines[:2])
            reply = "\n".join(lines[2 : 2 + rng.randint(2, 4)])
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
            yield _record(f"chat-text/{work['id']}/{n:06d}", "chat-text", "text", messages, seed)
            n += 1
            if n >= count:
                return


def iter_chat(domains: Iterable[str] = CHAT_DOMAINS, *, math_count: int = 20_000, code_count: int = 2_000,
              text_count: int = 5_000, seed: int = 0, max_operand: int = 0) -> Iterator[dict]:
    """Conversations per domain (see the module docstring), each with its `split`."""
    domains = tuple(domains)
    unknown = set(domains) - set(CHAT_DOMAINS)
    if unknown:
        raise ConfigError(f"unknown chat domain(s) {sorted(unknown)}: expected some of {list(CHAT_DOMAINS)}")
    makers = {"math": lambda: math_chats(math_count, seed, max_operand), "code": lambda: code_chats(code_count, seed),
              "text": lambda: text_chats(text_count, seed)}
    yield from itertools.chain.from_iterable(makers[d]() for d in CHAT_DOMAINS if d in domains)
