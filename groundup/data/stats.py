"""Counters for the curation report: documents and bytes in and out of every stage, per domain
and per source, the reasons for removal, a few removed examples and the time spent.

A shard's `StageStats` is saved as JSON next to its output and merged with the others', so a
restarted run reports the shards it skipped as if it had just processed them.
"""

from __future__ import annotations

from collections import defaultdict

Counts = dict[str, int]


def _cell() -> dict:
    return {"docs_in": 0, "bytes_in": 0, "docs_out": 0, "bytes_out": 0, "reasons": defaultdict(int)}


class StageStats:
    def __init__(self, examples: int = 5, snippet_chars: int = 300):
        self.examples_limit = examples
        self.snippet_chars = snippet_chars
        self.stages: dict[str, dict] = {}
        self.order: list[str] = []

    def _stage(self, name: str) -> dict:
        if name not in self.stages:
            self.order.append(name)
            self.stages[name] = {"by_domain": defaultdict(_cell), "by_source": defaultdict(_cell),
                                 "examples": [], "seconds": 0.0, "extra": defaultdict(int)}
        return self.stages[name]

    def record(self, name: str, record: dict, bytes_in: int, reason: str | None, bytes_out: int | None = None,
               text: str | None = None) -> None:
        """One document went through stage `name`: kept when `reason` is None."""
        stage = self._stage(name)
        for cell in (stage["by_domain"][record["domain"]], stage["by_source"][record["source"]]):
            cell["docs_in"] += 1
            cell["bytes_in"] += bytes_in
            if reason is None:
                cell["docs_out"] += 1
                cell["bytes_out"] += bytes_in if bytes_out is None else bytes_out
            else:
                cell["reasons"][reason] += 1
        if reason is not None and len(stage["examples"]) < self.examples_limit:
            snippet = (text if text is not None else record.get("text", ""))[: self.snippet_chars]
            stage["examples"].append({"id": record["id"], "source": record["source"], "domain": record["domain"],
                                      "reason": reason, "snippet": snippet})

    def add_cell(self, name: str, group: str, key: str, docs_in: int, bytes_in: int, docs_out: int,
                 bytes_out: int, reason: str | None = None) -> None:
        """Counts computed in bulk (the global stages); removed documents count under `reason`."""
        cell = self._stage(name)[group][key]
        cell["docs_in"] += docs_in
        cell["bytes_in"] += bytes_in
        cell["docs_out"] += docs_out
        cell["bytes_out"] += bytes_out
        if reason and docs_in > docs_out:
            cell["reasons"][reason] += docs_in - docs_out

    def add_example(self, name: str, example: dict) -> None:
        stage = self._stage(name)
        if len(stage["examples"]) < self.examples_limit:
            stage["examples"].append({**example, "snippet": example.get("snippet", "")[: self.snippet_chars]})

    def count(self, name: str, key: str, value: int = 1) -> None:
        """A stage-specific counter (PII replacements by kind, for example)."""
        self._stage(name)["extra"][key] += value

    def add_time(self, name: str, seconds: float) -> None:
        self._stage(name)["seconds"] += seconds

    def to_dict(self) -> dict:
        def plain(cells: dict) -> dict:
            return {k: {**v, "reasons": dict(v["reasons"])} for k, v in sorted(cells.items())}

        return {name: {"by_domain": plain(s["by_domain"]), "by_source": plain(s["by_source"]),
                       "examples": s["examples"], "seconds": round(s["seconds"], 4), "extra": dict(s["extra"])}
                for name, s in ((n, self.stages[n]) for n in self.order)}

    def merge_dict(self, data: dict) -> None:
        """Add a shard's saved `to_dict()` to these totals (examples: first shards first)."""
        for name, s in data.items():
            stage = self._stage(name)
            for group in ("by_domain", "by_source"):
                for key, cell in s[group].items():
                    mine = stage[group][key]
                    for field in ("docs_in", "bytes_in", "docs_out", "bytes_out"):
                        mine[field] += cell[field]
                    for reason, n in cell["reasons"].items():
                        mine["reasons"][reason] += n
            room = self.examples_limit - len(stage["examples"])
            stage["examples"].extend(s["examples"][:max(0, room)])
            stage["seconds"] += s["seconds"]
            for key, n in s.get("extra", {}).items():
                stage["extra"][key] += n


def totals(cells: dict) -> dict:
    """Sum of a by_domain or by_source table."""
    out = {"docs_in": 0, "bytes_in": 0, "docs_out": 0, "bytes_out": 0}
    for cell in cells.values():
        for k in out:
            out[k] += cell[k]
    return out
