"""DCP checkpoints taken with one layout resume with another, on CPU with gloo.

One run directory goes through a chain of layouts: each segment trains a few steps and checkpoints at
its end, and the next segment resumes it under another layout with a later train.max_steps. A constant
learning rate without warmup makes the segments' schedule the same as one uninterrupted run's, so every
segment's losses and the final weights are compared with a one-process run over all STEPS steps.
One domain and a global batch of 4 sequences, so every split of the batch reads the same windows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from groundup.layout import read_checkpoint_meta, step_name
from groundup.train import train
from tests.train_helpers import TINY, env, metrics, shared_shards, tiny_config

STEPS = 6
COMMON = ["checkpoint.every=100", "eval.at_end=false", "train.device=cpu", "data.domain_weights={text = 1.0}",
          "schedule.kind=constant", "schedule.warmup_steps=0", "model.tie_embeddings=false"]
MOE = ["model.n_experts=4", "model.moe_top_k=2"]
PIPELINE = Path(__file__).resolve().parents[1] / "groundup" / "train" / "pipeline.py"


def segment(run: Path, processes: int, until: int, *args: str, shards: Path, new: bool = False,
            dp: int | None = None) -> None:
    """Train `run` to step `until` on `processes` processes, `dp` of them reading different data (a global
    batch of 4): a new run when `new`, else a resume of it under the layout `args` set."""
    batch = f"train.batch_size={4 // (dp or processes)}"
    if processes == 1:
        train(tiny_config(shards, *COMMON, *args, batch, f"train.max_steps={until}"), run, resume=not new)
        return
    tiny = [o for o in TINY if not o.startswith(("train.batch_size", "train.threads"))]
    start = ["--out", str(run), f"data.shards={shards}", *tiny, *COMMON] if new else ["--resume", str(run)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
           "-m", "groundup", "train", *start, *args, batch, f"train.max_steps={until}", "train.threads=1", "--quiet"]
    result = subprocess.run(cmd, capture_output=True, text=True, env={**env(), "OMP_NUM_THREADS": "1"}, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]


def losses(run):
    return [s["loss"] for s in metrics(run)[0]]


def layout(run: Path, step: int) -> dict:
    return read_checkpoint_meta(run / "checkpoints" / step_name(step))["sharded"]


def assert_same_run(run: Path, ref: Path) -> None:
    """Every step's loss and the final weights of the reference (fp32 rounding apart)."""
    assert len(losses(run)) == STEPS
    assert losses(run) == pytest.approx(losses(ref), abs=1e-5)
    a = load_file(run / "checkpoints" / step_name(STEPS) / "model.safetensors")
    b = load_file(ref / "checkpoints" / step_name(STEPS) / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:  # Adam turns summation-order rounding of near-zero gradients into 1e-5-sized updates
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return shared_shards(tmp_path_factory)[0]


@pytest.fixture(scope="module")
def dense(shards, tmp_path_factory):
    run = tmp_path_factory.mktemp("reshard") / "single"
    segment(run, 1, STEPS, shards=shards, new=True)
    return run


def test_tp2_x_dp2_then_fsdp4_then_ddp2(shards, dense, tmp_path):
    run = tmp_path / "chain"
    segment(run, 4, 2, "distributed.strategy=fsdp", "distributed.tp=2", shards=shards, new=True, dp=2)
    saved = layout(run, 2)
    assert (saved["processes"], saved["tp"]) == (4, 2) and saved["split_projections"]  # q/k/v split in the shards
    # TP2 x DP2 -> FSDP 4: the names differ (q/k/v split), so each process reads the whole state
    segment(run, 4, 4, "distributed.tp=1", shards=shards)
    assert (layout(run, 4)["processes"], layout(run, 4)["tp"], layout(run, 4)["split_projections"]) == (4, 1, {})
    segment(run, 2, STEPS, "distributed.strategy=ddp", shards=shards)  # FSDP 4 -> DDP 2 (full-state checkpoint)
    assert "sharded" not in read_checkpoint_meta(run / "checkpoints" / step_name(STEPS))
    assert_same_run(run, dense)


def test_ep2_then_one_process(shards, tmp_path):
    ref = tmp_path / "moe-single"
    segment(ref, 1, STEPS, *MOE, shards=shards, new=True)
    run = tmp_path / "ep"
    segment(run, 2, 3, *MOE, "distributed.ep=2", shards=shards, new=True)
    assert layout(run, 3)["processes"] == 2  # the experts' shards: a DCP checkpoint
    segment(run, 1, STEPS, *MOE, "distributed.ep=1", shards=shards)
    assert_same_run(run, ref)


@pytest.mark.skipif(not PIPELINE.exists(), reason="pipeline parallelism (groundup/train/pipeline.py) not built yet")
def test_pp2_x_dp2_then_fsdp4(shards, dense, tmp_path):
    run = tmp_path / "pp"
    segment(run, 4, 3, "distributed.strategy=fsdp", "distributed.pp=2", shards=shards, new=True, dp=2)
    segment(run, 4, STEPS, "distributed.pp=1", shards=shards)
    assert_same_run(run, dense)
