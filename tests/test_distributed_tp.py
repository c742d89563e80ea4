"""Tensor parallelism and sharded (DCP) checkpoints on CPU with gloo, against one process with the same global batch.

One domain, so that every split of the global batch of 4 sequences reads exactly the 4 windows one
process reads: TP=2 on 2 processes reads 4 per tp group; FSDP2 x TP on 4 processes, 2 per dp group.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from groundup.layout import checkpoint_problem, read_checkpoint_meta
from groundup.train import train
from tests.test_distributed import COMMON, STEPS, assert_weights_close, losses, rewind, summary
from tests.train_helpers import TINY, env, shared_shards, tiny_config

MODEL = [o for o in TINY if not o.startswith(("train.batch_size", "train.threads"))] + ["train.device=cpu"]


def torchrun(n: int, batch: int, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
           "-m", "groundup", "train", *args, f"train.batch_size={batch}", "train.threads=1", "--quiet"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    shards = shared_shards(tmp_path_factory)[0]
    run = tmp_path_factory.mktemp("tp") / "single"
    train(tiny_config(shards, *COMMON, "train.device=cpu"), run)
    return shards, run


def assert_matches(run, ref, first: int = 1) -> float:
    """Losses within 1e-5 of the reference run's (fp32), final weights close; returns the largest loss difference."""
    a, b = losses(run, first), losses(ref, first)
    assert len(a) == len(b) == STEPS - first + 1
    assert a == pytest.approx(b, abs=1e-5)
    assert_weights_close(run, ref)
    return max(abs(x - y) for x, y in zip(a, b))


def assert_sharded_checkpoint(run, processes: int, tp: int) -> None:
    step = run / "checkpoints" / f"step_{STEPS:07d}"
    assert checkpoint_problem(step) is None
    meta = read_checkpoint_meta(step)
    assert meta["sharded"]["processes"] == processes and meta["sharded"]["tp"] == tp
    shards = {f"__{r}_0.distcp" for r in range(processes)}
    assert shards | {".metadata", "model.safetensors", "model.toml", "optimizer_groups.pt"} <= set(meta["files"])
    assert "optimizer.pt" not in meta["files"]  # the optimizer state is in the shards only
    # The consolidated model directory holds the plain model's names: the fused projections.
    assert "blocks.0.attn.qkv_proj.weight" in load_file(step / "model.safetensors")


def test_tensor_parallel_matches_one_process_and_resumes(single, tmp_path, capsys):
    shards, ref = single
    run = tmp_path / "tp"
    torchrun(2, 4, "--out", str(run), f"data.shards={shards}", *MODEL, *COMMON, "distributed.strategy=fsdp",
             "distributed.tp=2")
    s = summary(run)
    assert (s["strategy"], s["tp"], s["processes"], s["world_size"]) == ("fsdp", 2, 2, 1)
    with capsys.disabled():
        print(f"\nTP=2 vs one process: largest loss difference over {STEPS} steps {assert_matches(run, ref):.3g}")
    assert_sharded_checkpoint(run, 2, 2)

    # 2 -> 2: its own step-5 shards, loaded in place, give the same steps 6-10 bit for bit.
    rewind(run, tmp_path / "tp-again", 5)
    torchrun(2, 4, "--resume", str(tmp_path / "tp-again"))
    assert losses(tmp_path / "tp-again") == losses(run)
    a = load_file(run / "checkpoints" / f"step_{STEPS:07d}" / "model.safetensors")
    b = load_file(tmp_path / "tp-again" / "checkpoints" / f"step_{STEPS:07d}" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)

    # 2 -> 1: one process reads the whole state from the shards (split projections fused back).
    rewind(run, tmp_path / "tp-then-single", 5)
    train(tiny_config(shards, *COMMON, "train.device=cpu", "distributed.strategy=ddp", "distributed.tp=1"),
          tmp_path / "tp-then-single", resume=True)
    assert_matches(tmp_path / "tp-then-single", ref, 6)


def test_one_process_checkpoint_resumes_under_tensor_parallel(single, tmp_path):
    """1 -> 2: a full-state checkpoint (fused projections) loaded into TP=2's split, sharded projections."""
    shards, ref = single
    rewind(ref, tmp_path / "single-then-tp", 5)
    torchrun(2, 4, "--resume", str(tmp_path / "single-then-tp"), "distributed.strategy=fsdp", "distributed.tp=2")
    assert summary(tmp_path / "single-then-tp")["tp"] == 2
    assert_matches(tmp_path / "single-then-tp", ref, 6)


def test_fsdp_x_tensor_parallel_on_four_processes(single, tmp_path, capsys):
    """A (dp 2, tp 2) mesh with sequence parallelism and asynchronous checkpoints; then 4 -> 2 processes."""
    shards, ref = single
    run = tmp_path / "fsdp-tp"
    torchrun(4, 2, "--out", str(run), f"data.shards={shards}", *MODEL, *COMMON, "distributed.strategy=fsdp",
             "distributed.tp=2", "distributed.sequence_parallel=true", "checkpoint.async_save=true")
    s = summary(run)
    assert (s["tp"], s["processes"], s["world_size"]) == (2, 4, 2)
    with capsys.disabled():
        print(f"\nFSDP2 x TP (2 x 2) vs one process: largest loss difference {assert_matches(run, ref):.3g}")
    assert_sharded_checkpoint(run, 4, 2)
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{STEPS:07d}"  # async writes completed

    # 4 -> 2 and TP -> plain FSDP2: the shards' names (split projections) differ from the model's, so
    # each process reads the whole state and loads it as a full state dict.
    rewind(run, tmp_path / "then-fsdp", 5)
    torchrun(2, 2, "--resume", str(tmp_path / "then-fsdp"), "distributed.tp=1", "distributed.sequence_parallel=false")
    assert (summary(tmp_path / "then-fsdp")["tp"], summary(tmp_path / "then-fsdp")["processes"]) == (1, 2)
    assert_matches(tmp_path / "then-fsdp", ref, 6)


def test_split_projections_convert_both_ways_and_own_their_step_counts():
    """The state-dict conversion between fused (checkpoint) and split (tensor-parallel) names."""
    from groundup.config import from_dict
    from groundup.model import Transformer
    from groundup.model.config import ModelConfig
    from groundup.train.parallelize import (fuse_param_groups, fuse_state, split_fused, split_names,
                                            split_param_groups, split_state)

    cfg = from_dict(ModelConfig, {"preset": "tiny", "vocab_size": 384, "qkv_bias": True})
    plain = Transformer(cfg)
    split = Transformer(cfg)
    split.load_state_dict(plain.state_dict())
    split_fused(split)
    splits = split_names(split)
    assert splits["blocks.0.attn.qkv_proj"] == (("q", "k", "v"), [64, 32, 32])
    tokens = torch.randint(0, 384, (2, 16))
    torch.testing.assert_close(split(tokens).logits, plain(tokens).logits, rtol=0, atol=1e-6)
    assert fuse_state(split.state_dict(), splits).keys() == plain.state_dict().keys()
    assert all(torch.equal(fuse_state(split.state_dict(), splits)[k], v) for k, v in plain.state_dict().items())
    assert split_state(plain.state_dict(), splits).keys() == split.state_dict().keys()

    step = torch.tensor(5.0)
    optim = {"blocks.0.attn.qkv_proj.weight": {"step": step, "exp_avg": torch.randn(128, 64)}}
    parts = split_state(optim, splits)
    steps = [parts[f"blocks.0.attn.qkv_proj.{n}.weight"]["step"] for n in "qkv"]
    # The optimizer increments each parameter's step count in place: one shared tensor would count 3x.
    assert len({id(s) for s in steps}) == 3 and all(float(s) == 5 for s in steps)
    assert torch.equal(fuse_state(parts, splits)["blocks.0.attn.qkv_proj.weight"]["exp_avg"],
                       optim["blocks.0.attn.qkv_proj.weight"]["exp_avg"])
    groups = [{"params": ["embed.weight", "blocks.0.attn.qkv_proj.weight"], "lr": 1.0}]
    assert split_param_groups(groups, splits)[0]["params"] == [
        "embed.weight", "blocks.0.attn.qkv_proj.q.weight", "blocks.0.attn.qkv_proj.k.weight",
        "blocks.0.attn.qkv_proj.v.weight"]
    assert fuse_param_groups(split_param_groups(groups, splits), splits) == groups


@pytest.mark.parametrize("override, message", [
    ({"n_experts": 4}, "mixture-of-experts"),
    ({"attention": "mla", "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16},
     "latent attention"),
    ({"n_heads": 4, "n_kv_heads": 1}, "must divide model.n_heads"),
])
def test_tensor_parallel_refuses_what_it_cannot_shard(override, message):
    from groundup.config import from_dict
    from groundup.errors import ConfigError
    from groundup.model.config import ModelConfig
    from groundup.train.parallelize import check_tp

    with pytest.raises(ConfigError, match=message):
        check_tp(from_dict(ModelConfig, {"preset": "tiny", **override}), 2)
