"""Automatic recovery end to end: 2 processes under `groundup launch` (torchrun --max-restarts), one rank
SIGKILLed mid-run, restarted, resumed from the newest intact checkpoint, ending on the very weights of an
uninterrupted run. (benchmarks/recovery.py runs the full experiment: 4 processes, 3 kills, a hang, Ray.)

The two runs go at once, so the test takes about as long as the restarted one (~30 s on 2 busy cores)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from safetensors.torch import load_file

from groundup.layout import step_name
from tests.train_helpers import env, metrics, shared_shards

STEPS = 6


def launch(run, shards, fault: str | None, restarts: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "groundup", "launch", "--cpu", "--nodes", "1", "--gpus-per-node", "2",
           "--max-restarts", str(restarts), "--", "train", "--out", str(run), f"data.shards={json.dumps(str(shards))}",
           f"train.max_steps={STEPS}", "checkpoint.every=2", "train.batch_size=2", "train.seq_len=64",
           "train.threads=1", "schedule.peak_lr=2e-3", "log.every=1", "eval.every=0", "eval.at_end=false",
           "distributed.timeout_s=60", "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**env(), "OMP_NUM_THREADS": "1", **({"GROUNDUP_FAULT": fault} if fault else {})})


def test_killed_rank_is_restarted_and_the_run_ends_on_the_uninterrupted_weights(tmp_path_factory, tmp_path):
    shards = shared_shards(tmp_path_factory, "text", ("text",))[0]
    ref, faulted = tmp_path / "ref", tmp_path / "faulted"
    procs = [launch(ref, shards, None, 0), launch(faulted, shards, "kill:rank=1:step=3", 2)]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)

    assert (faulted / ".fault-0.done").read_text().startswith("kill rank 1 step 3")
    resumed = [(e["step"], e["from"]) for e in metrics(faulted)[1] if e["event"] == "resume"]
    assert resumed == [(2, step_name(2))]  # the second attempt began at the checkpoint before the kill
    assert "failed (exitcode:" in logs[1] and "failed (exitcode:" not in logs[0]  # torchrun saw the attempt fail
    a = load_file(ref / "checkpoints" / step_name(STEPS) / "model.safetensors")
    b = load_file(faulted / "checkpoints" / step_name(STEPS) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [s["loss"] for s in metrics(faulted)[0]] == [s["loss"] for s in metrics(ref)[0]]
