"""Resumable stages: each stage runs once, records its time and fingerprint, and is reused after.

`OUT/stages.json` remembers, per stage, a fingerprint of everything the stage's output depends on
(its settings and the fingerprints of the stages before it) and how long it took. A second run
with the same settings reuses finished stages; a changed setting reruns that stage and everything
after it; `fresh=True` reruns everything. The file is rewritten atomically after every stage, so a
crash or Ctrl-C loses only the stage in progress.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from groundup.io import atomic_write_json, read_json

STAGES_FILE = "stages.json"


def fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def banner(text: str) -> None:
    line = "=" * max(60, len(text) + 4)
    print(f"\n{line}\n  {text}\n{line}", file=sys.stderr, flush=True)


class StageRunner:
    def __init__(self, out: Path, fresh: bool = False):
        self.out = out
        self.path = out / STAGES_FILE
        self.state: dict[str, dict] = {} if fresh or not self.path.is_file() else read_json(self.path)
        self.previous = ""  # fingerprint chain: a stage depends on every stage before it
        self.order: list[str] = []
        self.started = time.perf_counter()
        self.prepare: Callable[[], dict] | None = None  # called before a stage runs; its result is recorded

    def elapsed(self) -> float:
        """Seconds spent in this invocation so far."""
        return time.perf_counter() - self.started

    def run(self, name: str, title: str, settings: Any, outputs: list[Path], fn: Callable[[], Any]) -> Any:
        """Run `fn` unless a finished run with the same fingerprint left all `outputs` in place."""
        key = fingerprint(self.previous, name, settings)
        self.previous = key
        self.order.append(name)
        record = self.state.get(name, {})
        if record.get("fingerprint") == key and record.get("status") == "done" and all(p.exists() for p in outputs):
            print(f"[{name}] reusing finished stage ({record['seconds']:.1f} s when it ran)", file=sys.stderr)
            return record.get("result")
        for path in outputs:  # stale output of an earlier, different run
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        banner(f"{len(self.order)}. {title}")
        start = time.perf_counter()
        prepared = self.prepare() if self.prepare is not None else {}
        result = fn()
        seconds = time.perf_counter() - start
        self.state[name] = {"status": "done", "fingerprint": key, "seconds": round(seconds, 2),
                            "title": title, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "result": result,
                            **prepared}
        atomic_write_json(self.path, self.state)
        print(f"[{name}] done in {seconds:.1f} s", file=sys.stderr, flush=True)
        return result

    def times(self) -> dict[str, float]:
        return {name: self.state[name]["seconds"] for name in self.order if name in self.state}
