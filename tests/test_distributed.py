"""DDP and FSDP2 on CPU with 2 processes and gloo, against one process with the same global batch.

One domain, so that 2 processes x 2 sequences read exactly the 4 windows one process reads.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from groundup.train import train
from tests.train_helpers import env, metrics, shared_shards, tiny_config

STEPS = 10
COMMON = [f"train.max_steps={STEPS}", "checkpoint.every=5", "eval.at_end=false", "data.domain_weights={text = 1.0}"]


def torchrun(run, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "groundup", "train", *args, "train.batch_size=2", "train.threads=1", "--quiet"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    shards = shared_shards(tmp_path_factory)[0]
    run = tmp_path_factory.mktemp("dist") / "single"
    train(tiny_config(shards, *COMMON), run)
    return shards, run


def summary(run) -> dict:
    import json

    return json.loads((run / "summary.json").read_text())


def losses(run, first=1):
    return [s["loss"] for s in metrics(run)[0] if s["step"] >= first]


def rewind(src, dst, step: int):
    """A copy of run `src` as it was right after its step-`step` checkpoint."""
    shutil.copytree(src, dst)
    for path in (dst / "checkpoints").iterdir():
        if path.is_dir() and int(path.name.split("_")[1]) > step:
            shutil.rmtree(path)
    (dst / "checkpoints" / "latest").write_text(f"step_{step:07d}\n")


def assert_weights_close(a, b):
    wa = load_file(a / "checkpoints" / f"step_{STEPS:07d}" / "model.safetensors")
    wb = load_file(b / "checkpoints" / f"step_{STEPS:07d}" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-4, rtol=1e-4)  # a near-zero Adam update can round 5e-5 apart


def two_processes_match_one(shards, ref, run, strategy: str) -> None:
    """A fresh 2-process run with `strategy` takes the reference run's steps (fp32 rounding apart)."""
    torchrun(run, "--out", str(run), f"data.shards={shards}", *_tiny(), *COMMON, f"distributed.strategy={strategy}")
    assert (summary(run)["strategy"], summary(run)["world_size"]) == (strategy, 2)
    assert len(losses(run)) == STEPS
    assert losses(run) == pytest.approx(losses(ref), abs=1e-5)
    assert_weights_close(run, ref)


def test_ddp_matches_one_process(single, tmp_path):
    shards, ref = single
    two_processes_match_one(shards, ref, tmp_path / "ddp", "ddp")


def test_fsdp2_matches_one_process_and_checkpoints_cross_load(single, tmp_path):
    shards, ref = single
    run = tmp_path / "fsdp"
    two_processes_match_one(shards, ref, run, "fsdp")

    # The FSDP2 checkpoint of step 5, resumed by one process, takes the same steps 6-10.
    rewind(run, tmp_path / "fsdp-then-single", 5)
    train(tiny_config(shards, *COMMON), tmp_path / "fsdp-then-single", resume=True)
    assert losses(tmp_path / "fsdp-then-single", 6) == pytest.approx(losses(ref, 6), abs=1e-5)
    assert_weights_close(tmp_path / "fsdp-then-single", ref)

    # And the one-process checkpoint of step 5, resumed under FSDP2 built on the meta device.
    rewind(ref, tmp_path / "single-then-fsdp", 5)
    torchrun(None, "--resume", str(tmp_path / "single-then-fsdp"), "distributed.strategy=fsdp",
             "distributed.meta_init=true")
    assert summary(tmp_path / "single-then-fsdp")["strategy"] == "fsdp"
    assert losses(tmp_path / "single-then-fsdp", 6) == pytest.approx(losses(ref, 6), abs=1e-5)
    assert_weights_close(tmp_path / "single-then-fsdp", ref)


def _tiny():
    from tests.train_helpers import TINY

    return [o for o in TINY if not o.startswith(("train.batch_size", "train.threads"))]


def test_meta_initialisation_leaves_no_memory_uninitialised():
    """What FSDP's meta_init does per shard, on one process: every parameter and buffer is set."""
    from groundup.model import Transformer
    from tests.conftest import tiny_config

    cfg = tiny_config(n_experts=4, moe_top_k=2, bias=True, norm="layernorm")
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device="cpu")
    for t in [*model.parameters(), *model.buffers()]:
        t.data.fill_(float("nan"))  # what to_empty may leave behind
    model.reset_buffers()
    with torch.no_grad():
        model.init_weights()
    assert all(torch.isfinite(t).all() for t in [*model.parameters(), *model.buffers()])
    assert torch.equal(model.blocks[0].attn_norm.weight, torch.ones(cfg.d_model))
