"""HSDP (FSDP2 hybrid sharding) on CPU with gloo: 2 replicas x 2 shards against one process with the same batch.

One domain, so 4 processes x 1 sequence read exactly the 4 windows one process reads.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from groundup.config import load_config
from groundup.errors import ConfigError
from groundup.layout import read_checkpoint_meta
from groundup.train import TrainConfig, train
from groundup.train.mesh import coordinates, mesh_dims
from tests.test_distributed import COMMON, STEPS, assert_weights_close, losses, rewind, summary
from tests.test_pipeline import torchrun
from tests.train_helpers import shared_shards, tiny_config

MODEL = ["train.seq_len=32", "train.device=cpu"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    shards = shared_shards(tmp_path_factory)[0]
    run = tmp_path_factory.mktemp("hsdp") / "single"
    train(tiny_config(shards, *COMMON, *MODEL), run)
    return shards, run


def test_hsdp_2x2_matches_one_process_and_its_checkpoint_resumes_on_one(single, tmp_path):
    shards, ref = single
    run = tmp_path / "hsdp"
    torchrun(4, "--out", str(run), f"data.shards={shards}", *MODEL, *COMMON, "schedule.peak_lr=2e-3", "log.every=1",
             "eval.every=0", "train.batch_size=1", "distributed.strategy=hsdp", "distributed.replicas=2")
    s = summary(run)
    assert (s["strategy"], s["replicas"], s["world_size"], s["processes"]) == ("fsdp", 2, 4, 4)
    a, b = losses(run), losses(ref)
    assert len(a) == STEPS and a == pytest.approx(b, abs=1e-5)
    assert_weights_close(run, ref)
    assert read_checkpoint_meta(run / "checkpoints" / f"step_{STEPS:07d}")["sharded"]["processes"] == 4

    # Its DCP checkpoint of step 5 (replicated shards written once), resumed by one process.
    rewind(run, tmp_path / "hsdp-then-single", 5)
    train(tiny_config(shards, *COMMON, *MODEL), tmp_path / "hsdp-then-single", resume=True)
    assert losses(tmp_path / "hsdp-then-single", 6) == pytest.approx(losses(ref, 6), abs=1e-5)
    assert_weights_close(tmp_path / "hsdp-then-single", ref)


def test_hsdp_with_gradient_accumulation(single, tmp_path):
    """2 replicas of 1 shard, each step 2 micro-batches of 1 sequence per process: the same 4 sequences."""
    shards, ref = single
    run = tmp_path / "hsdp-accum"
    torchrun(2, "--out", str(run), f"data.shards={shards}", *MODEL, *COMMON, "schedule.peak_lr=2e-3", "log.every=1",
             "eval.every=0", "train.batch_size=1", "train.grad_accum=2", "distributed.strategy=hsdp",
             "distributed.replicas=2")
    assert summary(run)["replicas"] == 2
    assert losses(run) == pytest.approx(losses(ref), abs=1e-5)
    assert_weights_close(run, ref)


def _dc(**kw):
    base = dict(strategy="hsdp", replicas=0, pp=1, tp=1)
    return SimpleNamespace(**{**base, **kw})


def test_mesh_replicates_across_nodes_and_shards_within():
    # 4 nodes x 8 processes, replicas derived: one per node, sharded over the node's 8.
    assert mesh_dims(_dc(), 32, 8) == [("replicate", 4), ("shard", 8)]
    assert mesh_dims(_dc(replicas=2), 4, 4) == [("replicate", 2), ("shard", 2)]
    # With pipeline stages outermost and tensor parallelism innermost.
    assert mesh_dims(_dc(pp=2, tp=2), 32, 8) == [("pp", 2), ("replicate", 2), ("shard", 4), ("tp", 2)]
    assert mesh_dims(_dc(strategy="fsdp", pp=2), 4, 4) == [("pp", 2), ("dp", 2)]
    # Row-major rank layout: ranks 0-1 are replica 0's two shards.
    dims = [("pp", 2), ("replicate", 2), ("shard", 2)]
    assert [coordinates(dims, r) for r in (0, 1, 2, 5)] == [
        {"pp": 0, "replicate": 0, "shard": 0}, {"pp": 0, "replicate": 0, "shard": 1},
        {"pp": 0, "replicate": 1, "shard": 0}, {"pp": 1, "replicate": 0, "shard": 1}]


def test_mesh_refuses_what_does_not_divide():
    with pytest.raises(ConfigError, match="must divide the data-parallel processes") as e:
        mesh_dims(_dc(replicas=3), 4, 4)
    assert e.value.key == "distributed.replicas"
    with pytest.raises(ConfigError, match="pp x tp x data-parallel = processes") as e:
        mesh_dims(_dc(strategy="fsdp", pp=3), 4, 4)
    assert e.value.key == "distributed.pp"


def test_replicas_only_with_hsdp():
    with pytest.raises(ConfigError, match="only with strategy 'hsdp'"):
        load_config(TrainConfig, None, ["distributed.strategy=fsdp", "distributed.replicas=2"])
    cfg = load_config(TrainConfig, None, ["distributed.strategy=hsdp", "distributed.replicas=2"])
    assert cfg.distributed.replicas == 2
