"""Shared by the GPU check's part tests: run one part of benchmarks/gpu/ in --quick mode and read its record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def quick_part(name: str, out: Path, timeout: float = 240) -> tuple[dict, str]:
    """(the part's record from OUT/NAME.json, its stdout), after checking it ran cleanly on the CPU."""
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / f"{name}.py"), "--quick", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((out / f"{name}.json").read_text())
    assert record["part"] == name and record["quick"] is True and record["device"] == "cpu"
    assert not any(n.startswith("failed") for n in record["notes"]), record["notes"]
    return record, run.stdout
