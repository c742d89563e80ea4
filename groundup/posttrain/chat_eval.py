"""Greedy replies to held-out conversations: the share that end their turn, and arithmetic exact match.

    metrics = chat_metrics(model, tokenizer, examples, max_new_tokens=64)
    # {"end_turn": 0.98, "exact_match_strict": 0.41, "exact_match_lenient": 0.44, "replies": 200, "answered": 180}

One definition serves SFT's evaluation during training, the alignment stages and the demo's report
card, so the numbers of every model (base, SFT, aligned, quantized) are comparable:

- a reply is the model's greedy continuation of the chat template up to the assistant's turn
  (`render_chat(..., add_generation_prompt=True)`), at most `max_new_tokens`;
- it ends its turn when its last token is the tokenizer's end-of-turn token (a reply cut off by
  `max_new_tokens` does not);
- exact match, over examples whose record carries an `answer`: strict reads the `Answer:` line,
  lenient the last number of the reply (`rewards.extract_answer`), compared with the answer without
  thousands separators.

`native_math_metrics` asks a base model in its pretraining format instead ("Question: ...\\nSolution:"),
the fair measure of what pretraining alone gives.
"""

from __future__ import annotations

import json
from typing import Sequence

import torch

from groundup.infer import Generator, generate_with_tools
from groundup.posttrain.records import Example
from groundup.rewards.functions import extract_answer
from groundup.tools import ToolRunner

BATCH = 16  # prompts decoded together


def _exact(examples: Sequence, texts: Sequence[str]) -> dict:
    answered = [(ex, t) for ex, t in zip(examples, texts) if ex.meta.get("answer") is not None]
    if not answered:
        return {}
    out = {"answered": len(answered)}
    for strict, key in ((True, "exact_match_strict"), (False, "exact_match_lenient")):
        hits = [extract_answer(t, strict) == str(ex.meta["answer"]).replace(",", "") for ex, t in answered]
        out[key] = sum(hits) / len(hits)
    return out


@torch.no_grad()
def chat_replies(model, tokenizer, examples: Sequence[Example], max_new_tokens: int = 64):
    """Greedy replies (engine outputs) to each example's conversation up to its first learned reply."""

    gen = Generator(model, tokenizer)
    # A reply gets the room its prompt leaves (up to max_new_tokens). Only a prompt that would leave less
    # than that room or half the context loses tokens from its start: truncating every prompt to make room
    # for max_new_tokens would cut a short model's prompts to nothing (context 128, 128 new tokens).
    keep = model.cfg.max_seq_len - min(max_new_tokens, model.cfg.max_seq_len // 2)
    prompts = [tokenizer.render_chat(ex.messages[: ex.completion_at], add_generation_prompt=True,
                                     tools=ex.tools)[0][-keep:] for ex in examples]
    outs = []
    for i in range(0, len(prompts), BATCH):
        outs += gen.complete_ids(prompts[i : i + BATCH], max_new_tokens=max_new_tokens, temperature=0)
    return outs


def chat_metrics(model, tokenizer, examples: Sequence[Example], max_new_tokens: int = 64) -> dict:
    """End-of-turn share and exact match (strict, lenient) of greedy replies to `examples` (chats only)."""
    chats = [ex for ex in examples if ex.messages]
    if not chats:
        return {}
    outs = chat_replies(model, tokenizer, chats, max_new_tokens)
    end = tokenizer.end_of_turn_id
    record = {"replies": len(outs),
              "end_turn": sum(bool(o.token_ids) and o.token_ids[-1] == end for o in outs) / len(outs)}
    record.update(_exact(chats, [o.text for o in outs]))
    return record


@torch.no_grad()
def native_math_metrics(model, tokenizer, examples: Sequence[Example], max_new_tokens: int = 64) -> dict:
    """Exact match of a base model asked in the pretraining corpus's format: "Question: Q\\nSolution:"."""

    asked = [ex for ex in examples if ex.messages and ex.meta.get("answer") is not None]
    if not asked:
        return {}
    gen = Generator(model, tokenizer)
    prompts = [f"Question: {ex.messages[ex.completion_at - 1]['content']}\nSolution:" for ex in asked]
    texts = []
    for i in range(0, len(prompts), BATCH):
        outs = gen.generate(prompts[i : i + BATCH], max_new_tokens=max_new_tokens, temperature=0,
                            stop=["\n\n", "\nQuestion:"])
        texts += list(outs)
    return _exact(asked, texts)


def _first_reply(ex: Example) -> int:
    """The index of the example's first assistant message: a tool chat is asked up to there."""
    return next(i for i, m in enumerate(ex.messages) if m["role"] == "assistant")


@torch.no_grad()
def tool_chat_metrics(model, tokenizer, examples: Sequence[Example], runner: ToolRunner, max_new_tokens: int = 64,
                      max_tool_calls: int = 4) -> dict:
    """Greedy replies with tools: each example is asked up to its first assistant turn, shown its record's tool
    definitions (or the runner's), and answered through `generate_with_tools`, its calls run by `runner`.

    Returns exact match of the final reply (strict, lenient) over examples with an `answer`, `called` (the share
    of conversations that ran at least one call), `calls_ok` (the share of calls that parsed, named a tool and
    ran without error: the model called the tool correctly), `end_turn` (final replies that ended their turn),
    and `replies`."""
    chats = [ex for ex in examples if ex.messages and any(m["role"] == "assistant" for m in ex.messages)]
    if not chats:
        return {}
    gen = Generator(model, tokenizer)
    outs: list = [None] * len(chats)
    by_tools: dict[str, list[int]] = {}  # records showing the same definitions are answered together
    for i, ex in enumerate(chats):
        by_tools.setdefault(json.dumps(ex.tools, sort_keys=True), []).append(i)
    for rows in by_tools.values():
        shown = chats[rows[0]].tools or None
        for start in range(0, len(rows), BATCH):
            part = rows[start : start + BATCH]
            done = generate_with_tools(gen, [chats[i].messages[: _first_reply(chats[i])] for i in part], runner,
                                       max_tool_calls=max_tool_calls, tools=shown, max_new_tokens=max_new_tokens,
                                       temperature=0)
            for i, out in zip(part, done):
                outs[i] = out
    calls = sum(o.tool_calls for o in outs)
    record = {"replies": len(outs), "called": sum(o.tool_calls > 0 for o in outs) / len(outs),
              "calls_ok": (calls - sum(o.tool_errors for o in outs)) / calls if calls else 0.0,
              "end_turn": sum(o.finish_reason == "stop" for o in outs) / len(outs)}
    record.update(_exact(chats, [o.text for o in outs]))
    return record
