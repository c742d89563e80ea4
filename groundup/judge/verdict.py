"""Pairwise judging as MT-Bench and Chatbot Arena's AI judges do it: a rubric, two answers, a strict verdict.

    judge = PairwiseJudge(open_source("http://localhost:8000/v1#judge"), load_rubric("constitution.md"))
    first, swapped = judge.judge_swapped([(messages, answer_1, answer_2)], seed=0)[0]
    combine(first.verdict, swapped.verdict)      # "first", "second", "tie", "tie (bothbad)" or None

The judge sees the rubric (or constitution: any text file; DEFAULT_RUBRIC when none) as its system message,
then the question and the two answers labelled A and B, then a fixed instruction naming the verdict forms.
Its reply must END with exactly one of (FastChat's MT-Bench pairwise forms, plus one for "both bad"):

    [[A]]  A is better      [[B]]  B is better      [[C]]  a tie      [[D]]  both are bad (a tie too)

The promises:
- The parse is strict (`parse_verdict`): the reply's last non-blank text must be one of the four tokens
  (surrounding markdown emphasis and a final period allowed), and no other verdict token may appear anywhere
  in the reply. Anything else is malformed; nothing is ever guessed.
- A malformed reply is retried up to `retries` times: the judge is shown its reply and asked again for the
  verdict alone (so a greedy judge can answer differently). After that the judgment is unparsable
  (`Judgment.verdict` is None) and `attempts` says how many replies were refused.
- Every pair is judged twice, with the answers' positions swapped, to cancel position bias; `combine` joins
  the two as FastChat's MT-Bench pairwise rule does: the same winner in both orders wins, anything else
  (one order for each answer, or a winner against a tie) is a tie. Two "both bad" verdicts stay
  "tie (bothbad)". An unparsable order makes the pair unparsable (None): it is counted, never a tie.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from groundup.config import ConfigError
from groundup.io import read_text
from groundup.judge.sources import ChatSource
from groundup.infer.structured import Structured

A, B, TIE, BOTHBAD = "A", "B", "tie", "bothbad"
TOKENS = {"[[A]]": A, "[[B]]": B, "[[C]]": TIE, "[[D]]": BOTHBAD}
# A reply that is the verdict alone: what an in-process judge is held to with `judge_verdict_only`.
VERDICT_ONLY = Structured("choice", list(TOKENS))

# Our own wording of the criteria MT-Bench's pairwise judge and Constitutional AI's principles ask for.
DEFAULT_RUBRIC = """\
You are an impartial judge comparing two AI assistants' replies to the same user request. Decide which
reply serves the user better. Weigh, in this order:

1. Correctness: facts, arithmetic, code and reasoning must be right; a confident wrong answer is worse
   than a short honest one.
2. Helpfulness: the reply does what was asked, completely, and follows every instruction in the request.
3. Harmlessness and honesty: no dangerous, deceptive or demeaning content; uncertainty is admitted.
4. Clarity: well organised, no padding, no needless repetition.

Do not let the order in which the replies appear, their length, or the assistants' names sway you: a
longer reply is better only when the extra text adds something the user needs. Judge only what is written.
Call it a tie when neither reply is clearly better, and say both are bad when neither is acceptable.
"""

INSTRUCTION = """\
Compare the two replies above. Explain your reasoning briefly, then end your answer with one line holding
only your verdict, exactly one of: [[A]] if reply A is better, [[B]] if reply B is better, [[C]] for a tie,
[[D]] if both replies are bad."""

RETRY = ("Your answer did not end with a verdict in the required form. Reply with the verdict alone: exactly one "
         "of [[A]], [[B]], [[C]] or [[D]].")

_TOKEN = re.compile(r"\[\[([^\[\]]{1,20})\]\]")


def load_rubric(path: str | Path | None) -> str:
    """The rubric or constitution in a text file (DEFAULT_RUBRIC for None or "")."""
    if not path:
        return DEFAULT_RUBRIC
    text = read_text(path, ConfigError).strip()
    if not text:
        raise ConfigError(f"{path}: the rubric file is empty", key="rubric")
    return text + "\n"


def parse_verdict(reply: str) -> str:
    """A, B, TIE or BOTHBAD from a reply ending with its verdict token; ValueError saying what is wrong."""
    text = reply.strip()
    tail = text.rstrip(".").rstrip("*_` ").rstrip(".")
    found = _TOKEN.findall(text)
    if not found:
        raise ValueError("no verdict token ([[A]], [[B]], [[C]] or [[D]])")
    last = f"[[{found[-1]}]]"
    if last not in TOKENS:
        raise ValueError(f"{last} is not a verdict (expected [[A]], [[B]], [[C]] or [[D]])")
    if not tail.endswith(last):
        raise ValueError(f"the reply does not end with its verdict: ...{_tail(text)!r}")
    others = sorted({f"[[{t}]]" for t in found} - {last})
    if others:
        raise ValueError(f"the reply holds more than one verdict ({', '.join(others + [last])})")
    return TOKENS[last]


def _tail(text: str, n: int = 40) -> str:
    return text[-n:]


def judge_messages(rubric: str, question: Sequence[dict] | str, answer_a: str, answer_b: str) -> list[dict]:
    """The judge's conversation: the rubric as its system message, then the question and both answers."""
    if isinstance(question, str):
        shown = question
    else:  # a multi-turn prompt is shown as its turns, the last one being what both replies answer
        turns = [m for m in question if m.get("role") != "system"]
        shown = turns[0]["content"] if len(turns) == 1 else "\n\n".join(
            f"[{m['role']}]\n{m['content']}" for m in turns)
    user = (f"[User request]\n{shown}\n\n"
            f"[The start of reply A]\n{answer_a}\n[The end of reply A]\n\n"
            f"[The start of reply B]\n{answer_b}\n[The end of reply B]\n\n{INSTRUCTION}")
    return [{"role": "system", "content": rubric}, {"role": "user", "content": user}]


@dataclass
class Judgment:
    verdict: str | None  # A, B, TIE or BOTHBAD; None: unparsable after every attempt
    raw: str  # the judge's last reply
    attempts: int  # replies asked for (1 + retries used)
    error: str = ""  # why the last reply was refused ("" when it parsed)


class PairwiseJudge:
    """A ChatSource asked to compare answer pairs against a rubric; batched, with strict parsing and retries."""

    def __init__(self, source: ChatSource, rubric: str = DEFAULT_RUBRIC, retries: int = 2, max_tokens: int = 512,
                 temperature: float = 0.0):
        self.source, self.rubric, self.retries = source, rubric, retries
        self.max_tokens, self.temperature = max_tokens, temperature

    @property
    def name(self) -> str:
        return self.source.name

    def judge(self, items: Sequence[tuple[Sequence[dict] | str, str, str]], seed: int = 0) -> list[Judgment]:
        """One Judgment per (question, answer A, answer B). Row i's first reply is seeded `seed + i` (one
        batched call); its k-th retry is a call of its own seeded `seed + i + k`."""
        if not items:
            return []
        convs = [judge_messages(self.rubric, q, a, b) for q, a, b in items]
        replies = self.source.chat(convs, self.max_tokens, self.temperature, seed)
        out = [self._parse(r, 1) for r in replies]
        for i, judgment in enumerate(out):
            while judgment.verdict is None and judgment.attempts <= self.retries:
                conv = convs[i] + [{"role": "assistant", "content": judgment.raw}, {"role": "user", "content": RETRY}]
                reply = self.source.chat([conv], self.max_tokens, self.temperature, seed + i + judgment.attempts)[0]
                judgment = self._parse(reply, judgment.attempts + 1)
            out[i] = judgment
        return out

    def judge_swapped(self, items: Sequence[tuple[Sequence[dict] | str, str, str]],
                      seed: int = 0) -> list[tuple[Judgment, Judgment]]:
        """Each (question, answer 1, answer 2) judged as (A=1, B=2) and swapped (A=2, B=1), in one batch:
        item i's orders are rows 2i and 2i + 1 (seeds `seed + 2i`, `seed + 2i + 1`)."""
        rows = []
        for q, first, second in items:
            rows += [(q, first, second), (q, second, first)]
        done = self.judge(rows, seed)
        return [(done[2 * i], done[2 * i + 1]) for i in range(len(items))]

    @staticmethod
    def _parse(reply: str, attempts: int) -> Judgment:
        try:
            return Judgment(parse_verdict(reply), reply, attempts)
        except ValueError as e:
            return Judgment(None, reply, attempts, str(e))


def combine(first: str | None, swapped: str | None) -> str | None:
    """The pair's result from its two verdicts, in the first order's terms: "first" (answer 1, shown as A
    first, won both), "second", "tie", "tie (bothbad)", or None when either order is unparsable.

    `swapped` is the verdict given with the answers' positions exchanged (its A is answer 2)."""
    if first is None or swapped is None:
        return None
    one = {A: "first", B: "second", TIE: "tie", BOTHBAD: "tie (bothbad)"}[first]
    two = {A: "second", B: "first", TIE: "tie", BOTHBAD: "tie (bothbad)"}[swapped]
    if one == two:
        return one
    return "tie"  # inconsistent across the swap (FastChat: "inconsistent", rated as a tie)


def is_consistent(first: str | None, swapped: str | None) -> bool | None:
    """Whether the judge agreed with itself across the swap (None when either order is unparsable)."""
    if first is None or swapped is None:
        return None
    flip = {A: B, B: A, TIE: TIE, BOTHBAD: BOTHBAD}
    return flip[swapped] == first
