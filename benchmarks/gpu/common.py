"""What every part of the GPU check shares: its command line, its device, timing and its result file.

Each part is a script, `python benchmarks/gpu/PART.py --out DIR [--quick]`, that writes DIR/PART.json:

    {"part": "decode", "device": "NVIDIA H100 80GB HBM3", "quick": false, "seconds": 41.2,
     "results": {...the part's numbers...},
     "goals": [{"goal": "decode batch 1 vs HF generate", "target": 1.5, "value": 1.71, "met": true}],
     "notes": ["..."]}

--quick runs the same code on the CPU with tiny shapes (the test suite runs it, so the script cannot
rot while no GPU is at hand); without it the part needs CUDA. The driver, benchmarks/gpu_check.py,
runs each part in its own process with a time limit, so one failure or hang does not stop the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(description: str, extra=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, required=True, help="folder for PART.json")
    p.add_argument("--quick", action="store_true", help="tiny shapes on the CPU (the test suite's mode)")
    if extra:
        extra(p)
    return p.parse_args()


def device_for(quick: bool) -> torch.device:
    """CPU in --quick mode; otherwise CUDA, or exit 2 with the reason."""
    if quick:
        torch.set_num_threads(1)  # the test suite's machine is small and shared: no thread contention
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit("this part needs CUDA (run it with --quick for the CPU mode)")
    return torch.device("cuda")


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    """Seconds `fn()` took, the device's queue drained before and after."""
    sync(device)
    began = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - began


def peak_memory_gib(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def goal(name: str, target: float, value: float | None, higher_is_better: bool = True) -> dict:
    met = value is not None and (value >= target if higher_is_better else value <= target)
    return {"goal": name, "target": target, "value": value, "met": bool(met)}


def write_result(out: Path, part: str, device: torch.device, quick: bool, began: float, results: dict,
                 goals: list[dict] = (), notes: list[str] = (), echo: bool = True) -> dict:
    """Write OUT/PART.json atomically (a half-written file never looks like a result) and print it."""
    record = {"part": part, "device": device_name(device), "quick": quick,
              "seconds": round(time.perf_counter() - began, 1), "results": results, "goals": list(goals),
              "notes": list(notes)}
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{part}.json.tmp"
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, out / f"{part}.json")
    if echo:
        print(json.dumps(record))
    return record
