"""The formats `groundup data pairs` writes its pairs in (`--format`), each one a posttrain verb reads as it is.

    records = as_format(pairs, "kto")

- "pairs": TRL's preference format, prompt / chosen / rejected (with each side's score or rank): what
  `groundup dpo` and the reward model (`groundup rm`) read.
- "kto": TRL's unpaired format, prompt / completion / label, as TRL's `unpair_preference_dataset` turns
  a preference dataset into one: each pair's chosen completion labelled True, its rejected one False
  (its score or rank kept as `score` / `rank`, the prompt record's other fields kept): what `groundup kto`
  reads.
"""

from __future__ import annotations

FORMATS = ("pairs", "kto")
_SIDES = ("chosen", "rejected")
_PER_SIDE = ("score", "rank")


def as_format(pairs: list[dict], fmt: str) -> list[dict]:
    """The pairs as `fmt` writes them (see the module docstring)."""
    if fmt == "pairs":
        return pairs
    out = []
    for r in pairs:
        rest = {k: v for k, v in r.items() if k not in _SIDES and not k.startswith(("chosen_", "rejected_"))}
        for side, label in zip(_SIDES, (True, False)):
            extra = {key: r[f"{side}_{key}"] for key in _PER_SIDE if f"{side}_{key}" in r}
            out.append({**rest, "completion": r[side], "label": label, **extra})
    return out
