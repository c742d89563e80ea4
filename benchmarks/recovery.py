"""The recovery experiment: runs that lose ranks end on the same weights as a run that lost none.

    python benchmarks/recovery.py [--procs 4] [--steps 16] [--seed 0] [--out /tmp/recovery] [--skip-ray]

On CPU with gloo, N processes (default 4) pretrain the tiny model through `groundup launch`, with a
checkpoint every 2 steps:

  (a) uninterrupted (torchrun, no restarts): the reference weights;
  (b) a random rank SIGKILLed at 3 random steps (GROUNDUP_FAULT=kill:...), torchrun --max-restarts;
  (c) rank 1 stops responding at step 5 (GROUNDUP_FAULT=hang:...): the hang detector
      (train.hang_timeout_s) ends it and torchrun restarts the group;
  (d) (b) under Ray Train (a local Ray, N workers, FailureConfig(max_failures));
  (e) (c) under Ray Train.

Each run must end with final weights equal to (a) (torch.equal on every tensor). Prints one JSON
object (every run's wall time, attempts, resumes, equality) and a markdown table. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from groundup.corpus import chunk_text, iter_shakespeare  # noqa: E402
from groundup.layout import step_name  # noqa: E402
from groundup.tokenizer import TokenizerConfig, train_tokenizer  # noqa: E402
from groundup.tokens.shards import TokenizeConfig, tokenize_to_shards  # noqa: E402


def make_shards(root: Path) -> Path:
    """Token shards of one Shakespeare work with a 384-token BPE (a few seconds)."""
    if (root / "shards" / "index.json").is_file():
        return root / "shards"
    work = next(iter_shakespeare())
    texts = chunk_text(work["text"], 3000)
    root.mkdir(parents=True, exist_ok=True)
    tok_dir = train_tokenizer(iter(texts), TokenizerConfig(vocab_size=384), progress=False).save(root / "tokenizer")
    src = root / "records.jsonl"
    src.write_text("".join(json.dumps({"id": f"w#{i}", "source": "shakespeare", "domain": "text", "text": t}) + "\n"
                           for i, t in enumerate(texts)))
    tokenize_to_shards([src], tok_dir, root / "shards", TokenizeConfig(workers=1, val_fraction=0.05), progress=False)
    return root / "shards"


def launch(run: Path, shards: Path, args, backend: str, restarts: int, fault: str | None, extra=()) -> dict:
    cmd = [sys.executable, "-m", "groundup", "launch", "--backend", backend, "--cpu", "--nodes", "1",
           "--gpus-per-node", str(args.procs), "--max-restarts", str(restarts), "--",
           "train", "--out", str(run), f"data.shards={shards}", f"train.max_steps={args.steps}", "checkpoint.every=2",
           "checkpoint.keep_last=3", "train.batch_size=2", "train.seq_len=64", "train.threads=1",
           "schedule.peak_lr=2e-3", "log.every=1", "eval.every=0", "eval.at_end=false", "distributed.timeout_s=60",
           "--quiet", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GROUNDUP_FAULT": fault or ""}
    started = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    wall = time.perf_counter() - started
    (run.parent / f"{run.name}.log").write_text(result.stdout + result.stderr)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] if \
        (run / "metrics.jsonl").is_file() else []
    resumes = [e for e in events if e.get("event") == "resume"]
    return {"run": run.name, "backend": backend, "fault": fault or "none", "exit_code": result.returncode,
            "wall_s": round(wall, 1), "attempts": 1 + len(resumes), "resumed_from": [e["step"] for e in resumes],
            "faults_fired": sorted(p.name for p in run.glob(".fault-*.done")),
            "hang_dumps": sorted(p.name for p in run.glob("hang-rank*.txt"))}


def equal_weights(run: Path, ref: Path, step: int) -> bool:
    path = Path("checkpoints") / step_name(step) / "model.safetensors"
    if not (run / path).is_file():
        return False
    a, b = load_file(ref / path), load_file(run / path)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="picks the killed ranks and steps")
    p.add_argument("--out", type=Path, default=Path("/tmp/groundup-recovery"))
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--skip-ray", action="store_true")
    args = p.parse_args()
    rng = random.Random(args.seed)
    kills = ",".join(f"kill:rank={rng.randrange(args.procs)}:step={s}"
                     for s in sorted(rng.sample(range(2, args.steps - 1), 3)))
    hang = "hang:rank=1:step=5"
    hang_keys = ["train.hang_timeout_s=10"]
    shards = make_shards(args.out / "data")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = args.out / stamp
    runs.mkdir(parents=True)
    rows = [launch(runs / "a-uninterrupted", shards, args, "torchrun", 0, None)]
    plan = [("b-kill-torchrun", "torchrun", kills, ()), ("c-hang-torchrun", "torchrun", hang, hang_keys)]
    if not args.skip_ray:
        plan += [("d-kill-ray", "ray", kills, ()), ("e-hang-ray", "ray", hang, hang_keys)]
    for name, backend, fault, extra in plan:
        rows.append(launch(runs / name, shards, args, backend, 4, fault, extra))
    ref = runs / "a-uninterrupted"
    for row in rows:
        row["equal_to_uninterrupted"] = equal_weights(runs / row["run"], ref, args.steps)
    report = {"procs": args.procs, "steps": args.steps, "checkpoint_every": 2, "seed": args.seed, "kills": kills,
              "hang": hang, "torch": torch.__version__, "cpus": os.cpu_count(), "runs_dir": str(runs), "runs": rows}
    print(json.dumps(report, indent=2))
    print("\n| run | backend | fault | exit | wall s | attempts | resumed from steps | final weights equal to (a) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['backend']} | {r['fault']} | {r['exit_code']} | {r['wall_s']} | {r['attempts']} | "
              f"{', '.join(map(str, r['resumed_from'])) or '-'} | {'yes' if r['equal_to_uninterrupted'] else 'NO'} |")


if __name__ == "__main__":
    main()
