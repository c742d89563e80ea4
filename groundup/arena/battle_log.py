"""Read a battle log (JSONL or Parquet, FastChat's columns) into checked rows; a bad row is skipped and counted.

A row: `model_a`, `model_b` (two different non-empty strings) and `winner`, one of `model_a`, `model_b`,
`tie`, `tie (bothbad)`. Optional, kept when well-formed: `battle_id`, `question_id`, `category`, `judge`,
`turn`, `prompt`, `answer_a`, `answer_b`, `swap` (true when model_b's answer was shown first),
`verdict_raw`, `attempts`, `tstamp`. `groundup arena` writes this format (arena/battles.py) and the chat
page's blind votes use it with judge "human". Every skipped row is counted with its `file:line` and reason;
only a log without a single usable row is an error.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Sequence

from groundup.arena.ratings import WINNERS
from groundup.data.readers import ReadStats, iter_records
from groundup.errors import DataError

MAX_EXAMPLES = 10  # skipped rows named in the summary and ratings.json
IDS = ("battle_id", "question_id")  # may be numbers in others' logs: read as strings
TEXT_FIELDS = ("battle_id", "question_id", "category", "judge", "prompt", "answer_a", "answer_b", "verdict_raw")


@dataclasses.dataclass
class BattleLog:
    rows: list[dict]  # the usable battles, in file order, each with `_where` = "file:line"
    skipped: Counter  # reason -> rows skipped for it
    examples: list[str]  # the first skipped rows: "file:line: reason"
    read: ReadStats  # what the reader saw below the row level (bad JSON lines, unreadable files)

    READ_PROBLEMS = {"bad_json": "bad json", "too_long": "line too long", "bad_field": "bad id/source/domain field",
                     "unreadable_files": "unreadable file"}

    def reasons(self) -> dict[str, int]:
        """Rows (or files) skipped, by reason: the reader's problems, then the rows' own."""
        read = {why: getattr(self.read, kind) for kind, why in self.READ_PROBLEMS.items() if getattr(self.read, kind)}
        return {**read, **self.skipped}

    @property
    def skipped_total(self) -> int:
        return sum(self.reasons().values())

    def problems(self) -> list[str]:
        return (self.examples + self.read.examples(MAX_EXAMPLES))[:MAX_EXAMPLES]


def check_row(row: dict) -> tuple[str, str] | None:
    """(the kind of problem, the reason) why `row` cannot be rated, or None when it can."""
    for key in ("model_a", "model_b"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            return f"bad {key}", f"'{key}' is missing or not a non-empty string"
    if row["model_a"] == row["model_b"]:
        return "same model", f"model_a and model_b are the same model ({row['model_a']!r})"
    winner = row.get("winner")
    if winner not in WINNERS:
        return "bad winner", f"'winner' is {winner!r}, expected one of {', '.join(WINNERS)}"
    if row.get("swap") is not None and not isinstance(row["swap"], bool):
        return "bad swap", f"'swap' is {row['swap']!r}, expected true or false"
    for key in TEXT_FIELDS:
        value = row.get(key)
        allowed = (str, int) if key in IDS else (str,)
        if value is not None and (isinstance(value, bool) or not isinstance(value, allowed)):
            return f"bad {key}", f"'{key}' is {type(value).__name__}, expected a string"
    stamp = row.get("tstamp")
    if stamp is not None and (isinstance(stamp, bool) or not isinstance(stamp, (int, float))):
        return "bad tstamp", f"'tstamp' is {stamp!r}, expected a number"
    return None


def read_battles(paths: Sequence[str | Path]) -> BattleLog:
    """Every usable battle of the JSONL/Parquet files `paths` (DataError when none is usable)."""
    stats = ReadStats()
    rows: list[dict] = []
    skipped: Counter = Counter()
    examples: list[str] = []
    for record in iter_records(list(paths), stats, require_text=False):  # DataError: a missing path, no record
        where = record.get("_where", "?")
        problem = check_row(record)
        if problem is None:
            for key in IDS:
                if isinstance(record.get(key), int):
                    record[key] = str(record[key])
            rows.append(record)
            continue
        kind, reason = problem
        skipped[kind] += 1
        if len(examples) < MAX_EXAMPLES:
            examples.append(f"{where}: {reason}")
    if not rows:
        raise DataError(f"no usable battle in {', '.join(map(str, paths))}: {sum(skipped.values()):,} rows skipped ("
                        + "; ".join(examples[:3]) + ")")
    return BattleLog(rows, skipped, examples, stats)


def one_per_battle(rows: list[dict]) -> list[dict]:
    """The battles to rate: the two orders of a battle (one judge, one battle_id, swap false and true) become
    one row as FastChat's MT-Bench pairwise rule combines them (the same model named both ways wins, two
    "both bad" stay "tie (bothbad)", anything else is a tie), in the place of its first order; every other
    row (a human vote, an order whose partner is missing) stays as it is."""
    orders: dict[tuple, dict[bool, int]] = {}
    for i, r in enumerate(rows):
        if isinstance(r.get("swap"), bool) and r.get("battle_id"):
            orders.setdefault((str(r.get("judge") or ""), r["battle_id"]), {})[r["swap"]] = i
    partner = {}
    for both in orders.values():
        if len(both) == 2:
            partner[both[False]], partner[both[True]] = both[True], both[False]
    out = []
    for i, r in enumerate(rows):
        if i not in partner:
            out.append(r)
        elif i < partner[i]:
            out.append({**r, "winner": _combined(r, rows[partner[i]]), "orders": 2})
    return out


def _combined(one: dict, two: dict) -> str:
    names = [r[r["winner"]] if r["winner"] in ("model_a", "model_b") else r["winner"] for r in (one, two)]
    if names[0] == names[1]:
        return names[0] if names[0] in WINNERS else ("model_a" if names[0] == one["model_a"] else "model_b")
    return "tie"
