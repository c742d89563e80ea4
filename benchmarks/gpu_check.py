"""The GPU check: one command that measures groundup's training, inference and serving on one GPU.

    python benchmarks/gpu_check.py --out DIR            # on a CUDA machine: about 8 minutes
    python benchmarks/gpu_check.py --out DIR --quick    # every part on the CPU with tiny shapes (the tests)

Parts, in order, each its own process under a time limit, so a crash or a hang costs only that part:
1. tests     the test suite's CUDA tests (`pytest -m cuda`: everything that skips without a GPU)
2. pretrain  training throughput and MFU, 124M and 1B Llama-shaped presets, against HF Llama compiled
             (benchmarks/gpu/pretrain.py)
3. fsdp      FSDP2 + DCP under torchrun (world size 1): async sharded save, blocked time, bit-exact resume
             (benchmarks/gpu/fsdp.py)
4. decode    tokens/s at batch 1, 8, 64, eager and compiled, against HF `generate`; int8/int4 weight-only
             against bf16 (benchmarks/gpu/decode.py)
5. serve     the server under load at concurrency 1, 16 and 64 (benchmarks/gpu/serve.py)

Writes DIR/gpu_check.json (every part's record, the machine, the goals), DIR/gpu_check.md (the goals
table and each part's numbers) and DIR/gpu_check.log (each part's output, tail-trimmed). Needs no
network; on the GPU machine only torch, transformers and the core dependencies (plus fastapi and
uvicorn for the server part).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTS = {  # name -> time limit in seconds (full mode); --quick parts take seconds
    "tests": 150,
    "pretrain": 330,
    "fsdp": 150,
    "decode": 180,
    "serve": 180,
}
LOG_TAIL = 6000  # characters of each part's output kept in the log


def cuda_test_files() -> list[str]:
    """Test files holding a test marked `cuda` (only those are collected: the GPU machine lacks the peers
    some other test files import)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")
                  if "mark.cuda" in p.read_text(encoding="utf-8"))


def part_command(name: str, work: Path, quick: bool, extra: list[str]) -> list[str]:
    if name == "tests":
        return [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
                *cuda_test_files()]
    return [sys.executable, str(REPO / "benchmarks" / "gpu" / f"{name}.py"), "--out", str(work),
            *(["--quick"] if quick else []), *extra]


def summary_counts(output: str) -> dict:
    """pytest's summary line ('3 passed, 2 skipped in 4.1s') as counts."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors")}
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", output):
        counts["errors" if word.startswith("error") else word] += int(number)
    return counts


def run_part(name: str, work: Path, quick: bool, limit: float, extra: list[str]) -> tuple[dict, str]:
    """Run one part; its record (from its JSON file, or a failure record) and its output."""
    began = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(part_command(name, work, quick, extra), cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=limit)
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        output += f"\n[gpu_check] {name} ran past its {limit:.0f} s limit and was stopped"
        code = "timeout"
    seconds = round(time.perf_counter() - began, 1)
    if name == "tests":
        counts = summary_counts(output)
        ok = code == 0 and counts["failed"] == counts["errors"] == 0
        goals = [{"goal": "every CUDA test passes", "target": 0, "value": counts["failed"] + counts["errors"],
                  "met": bool(ok and (quick or counts["passed"] > 0))}]
        return {"part": name, "quick": quick, "seconds": seconds, "exit": code, "results": counts,
                "goals": goals, "notes": []}, output
    path = work / f"{name}.json"
    if path.exists():
        record = json.loads(path.read_text())
        record["exit"] = code
        return record, output
    return {"part": name, "quick": quick, "seconds": seconds, "exit": code, "results": {}, "goals": [],
            "notes": [f"{name} wrote no result (exit {code}): {output.strip()[-800:]}"]}, output


def machine() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": platform.processor() or platform.machine()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info |= {"gpu": p.name, "gpu_memory_gib": round(p.total_memory / 2**30, 1), "sms": p.multi_processor_count}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# GPU check, {m['date']}", "",
             f"{m.get('gpu', 'no GPU (quick mode)')}; torch {m['torch']} (CUDA {m['cuda']}); "
             f"transformers {m.get('transformers', '-')}; Python {m['python']}", "",
             "| part | goal | target | value | met |", "| --- | --- | --- | --- | --- |"]
    for rec in report["parts"]:
        for g in rec.get("goals", []):
            lines.append(f"| {rec['part']} | {g['goal']} | {g['target']} | {g['value']} | "
                         f"{'yes' if g['met'] else '**no**'} |")
    for rec in report["parts"]:
        lines += ["", f"## {rec['part']} ({rec.get('seconds')} s, exit {rec.get('exit')})", "",
                  "```json", json.dumps(rec.get("results", {}), indent=1)[:6000], "```"]
        lines += [f"- {n}" for n in rec.get("notes", [])]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json, .md and .log")
    p.add_argument("--quick", action="store_true", help="every part on the CPU with tiny shapes")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--budget-s", type=float, default=480.0, help="the whole check's time limit")
    p.add_argument("--limit", action="append", default=[], metavar="PART=SECONDS",
                   help="a part's time limit (repeatable; defaults: " + ", ".join(f"{k} {v}" for k, v in PARTS.items()) + ")")
    p.add_argument("--arg", action="append", default=[], metavar="PART:ARG",
                   help="an extra argument for a part, e.g. pretrain:--presets=124m (repeatable)")
    args = p.parse_args()
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {unknown}; the parts are {list(PARTS)}")
    limits = dict(PARTS)
    for spec in args.limit:
        part, _, seconds = spec.partition("=")
        if part not in PARTS or not seconds.replace(".", "", 1).isdigit():
            p.error(f"--limit {spec}: expected PART=SECONDS with PART one of {list(PARTS)}")
        limits[part] = float(seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.budget_s
    records, log = [], []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for name in parts:
            left = deadline - time.perf_counter()
            if left < 10:
                records.append({"part": name, "results": {}, "goals": [], "notes": ["skipped: the budget ran out"]})
                continue
            limit = min(left, 120 if args.quick else limits[name])
            extra = [a.split(":", 1)[1] for a in args.arg if a.startswith(name + ":")]
            if name == "pretrain" and not any(a.startswith("--budget-s") for a in extra):
                extra.append(f"--budget-s={max(limit - 40, 10):.0f}")  # it skips variants that would not fit
            print(f"[gpu_check] {name} (limit {limit:.0f} s)", flush=True)
            record, output = run_part(name, Path(tmp), args.quick, limit, extra)
            records.append(record)
            log.append(f"===== {name} (exit {record.get('exit')}, {record.get('seconds')} s)\n{output[-LOG_TAIL:]}")
            met = [g["met"] for g in record.get("goals", [])]
            print(f"[gpu_check] {name}: {record.get('seconds')} s, goals met {sum(met)}/{len(met)}"
                  + "".join(f"\n  note: {n[:300]}" for n in record.get("notes", [])), flush=True)
            report = write_report(args.out, args.quick, records, log)  # after each part: a cut-off run keeps them
    print(markdown(report))
    return 0


def write_report(out: Path, quick: bool, records: list[dict], log: list[str]) -> dict:
    report = {"machine": machine(), "quick": quick, "parts": records}
    for name, text in (("gpu_check.json", json.dumps(report, indent=2)), ("gpu_check.md", markdown(report)),
                       ("gpu_check.log", "\n".join(log))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)
    return report


if __name__ == "__main__":
    sys.exit(main())
