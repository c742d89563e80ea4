"""What `groundup arena` fights over: the prompts, the battles planned between model pairs, and the logs.

    prompts, bad = read_prompts(path, categories=["math"])
    plan = uniform_plan(pairs, prompts, per_pair, seed, planned)        # or active_round(...)
    rows, stats = read_log(out / "battles.jsonl")                         # torn last line cut off, counted

The promises:
- A prompt line is JSON with `messages` (a chat, ending with a user turn) or `prompt` (a string), an
  optional `question_id` (or `id`; the line number otherwise) and `category` ("general" when absent). A bad
  line is skipped and counted with its file:line and reason; a repeated question id too.
- The k-th battle of a pair (models a < b by name) is the same whatever else runs: its prompt is the
  k-th of a permutation seeded by (seed, a, b) (cycling when k passes the prompt count), its order (who is
  shown first as model_a) a coin seeded by (seed, a, b, k), its id `a-vs-b-k`. A larger budget only adds
  battles.
- The uniform sampler gives every pair its share of the budget (pairs in turn). The active sampler plans a
  round at a time, each battle going to the pair whose win rate is least certain: the largest standard
  error sqrt(p(1-p)/(n+1)), p the pair's win rate so far with one pseudo-win each way, n its battles
  planned; so pairs far apart get few battles and close ones many, as Chatbot Arena's sampling favours
  the pairs whose order is in doubt.
- A log is append-only JSONL written a line at a time with flush + fsync (`LogWriter`); reading it drops a
  torn last line (a kill mid-write), counts it and cuts the file back so appends stay whole lines.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from groundup.io import read_text


@dataclass
class Prompt:
    index: int  # position in the prompt file (among usable prompts): answers are seeded by it
    question_id: str
    category: str
    messages: list[dict]

    @property
    def text(self) -> str:
        """The last user turn: what both answers reply to."""
        return self.messages[-1]["content"]


@dataclass
class Battle:
    battle_id: str
    question_id: str
    model_a: str  # shown first (as A) in the unswapped order
    model_b: str
    round: int = 0

    def to_dict(self) -> dict:
        return {"battle_id": self.battle_id, "question_id": self.question_id, "model_a": self.model_a,
                "model_b": self.model_b, "round": self.round}


@dataclass
class LogStats:
    torn: int = 0  # a last line cut by a kill, dropped (and cut from the file)
    bad: list[str] = field(default_factory=list)  # "file:line: reason" of lines that are not a JSON object


def read_prompts(path: str | Path, categories: Sequence[str] = ()) -> tuple[list[Prompt], list[str]]:
    """The usable prompts (in file order, of `categories` when given) and the skipped lines' reasons."""
    prompts: list[Prompt] = []
    bad: list[str] = []
    seen: set[str] = set()
    for n, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            bad.append(f"{where}: not JSON ({e.msg})")
            continue
        why = _prompt_problem(record)
        if why:
            bad.append(f"{where}: {why}")
            continue
        qid = str(record.get("question_id", record.get("id", f"line-{n}")))
        if qid in seen:
            bad.append(f"{where}: question_id {qid!r} repeats an earlier line")
            continue
        seen.add(qid)
        category = record.get("category") if isinstance(record.get("category"), str) else "general"
        if categories and category not in categories:
            continue
        messages = record["messages"] if "messages" in record else [{"role": "user", "content": record["prompt"]}]
        prompts.append(Prompt(len(prompts), qid, category,
                              [{"role": m["role"], "content": m["content"]} for m in messages]))
    return prompts, bad


def _prompt_problem(record) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            return "messages must be a non-empty list of {role, content} strings"
        if messages[-1]["role"] != "user":
            return "the last message must be the user's (the turn both models answer)"
        return None
    if isinstance(record.get("prompt"), str) and record["prompt"].strip():
        return None
    return "no `messages` list and no `prompt` string"


def model_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    return list(itertools.combinations(sorted(names), 2))


def nth_battle(pair: tuple[str, str], k: int, prompts: list[Prompt], seed: int, round: int = 0) -> Battle:
    a, b = pair
    order = list(range(len(prompts)))
    random.Random(f"{seed}:{a}:{b}").shuffle(order)
    prompt = prompts[order[k % len(prompts)]]
    first, second = (b, a) if random.Random(f"{seed}:{a}:{b}:{k}").random() < 0.5 else (a, b)
    return Battle(f"{a}-vs-{b}-{k}", prompt.question_id, first, second, round)


def pair_of(battle: Battle) -> tuple[str, str]:
    return tuple(sorted((battle.model_a, battle.model_b)))  # type: ignore[return-value]


def uniform_plan(pairs: list[tuple[str, str]], prompts: list[Prompt], total: int, seed: int,
                 planned: dict[tuple[str, str], int]) -> list[Battle]:
    """The battles to add so that `total` are spread over the pairs in turn (given those already planned)."""
    out = []
    for p, pair in enumerate(pairs):
        share = total // len(pairs) + (p < total % len(pairs))
        out += [nth_battle(pair, k, prompts, seed) for k in range(planned.get(pair, 0), share)]
    return out


def active_round(pairs: list[tuple[str, str]], prompts: list[Prompt], size: int, seed: int, round: int,
                 planned: dict[tuple[str, str], int], score: dict[tuple[str, str], tuple[float, int]]) -> list[Battle]:
    """`size` battles for the pairs whose win rate is least certain. `score[pair]` = (wins of the pair's
    first model by name, ties counted half; decided battles)."""
    counts = dict(planned)
    out = []
    for _ in range(size):
        def uncertainty(pair):
            wins, n = score.get(pair, (0.0, 0))
            p = (wins + 1) / (n + 2)
            return math.sqrt(p * (1 - p) / (counts.get(pair, 0) + 1))
        best = max(pairs, key=uncertainty)  # the first of equals: pairs in name order
        out.append(nth_battle(best, counts.get(best, 0), prompts, seed, round))
        counts[best] = counts.get(best, 0) + 1
    return out


def read_log(path: Path, keys: dict[str, type] | None = None) -> tuple[list[dict], LogStats]:
    """The rows of an append-only JSONL log (none when it does not exist); a torn last line is cut off, and
    a line that is not a JSON object, or lacks one of `keys` (name -> type), is skipped and counted."""
    stats = LogStats()
    if not path.exists():
        return [], stats
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):  # the writer died inside its last line
        stats.torn += 1
        with open(path, "r+b") as f:
            f.truncate(end)
            os.fsync(f.fileno())
    rows = []
    for n, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            stats.bad.append(f"{path}:{n}: not JSON ({e})")
            continue
        if not isinstance(row, dict):
            stats.bad.append(f"{path}:{n}: not a JSON object")
            continue
        if keys and not all(isinstance(row.get(k), t) for k, t in keys.items()):
            stats.bad.append(f"{path}:{n}: a row needs " + ", ".join(f"{k} ({t.__name__})" for k, t in keys.items()))
            continue
        rows.append(row)
    return rows, stats


class LogWriter:
    """Appends one JSON object per line; each line is on disk (flush + fsync) when `write` returns."""

    def __init__(self, path: Path):
        self.f = open(path, "a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self.f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()
