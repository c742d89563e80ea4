"""Pipeline parallelism on CPU with gloo, against one process with the same global batch of 4 sequences.

A 4-layer untied tiny model, and a tied one (the first and last stage each hold the embedding). One
domain, so every split of the global batch reads the 4 windows one process reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from groundup.config import load_config
from groundup.errors import ConfigError
from groundup.layout import read_checkpoint_meta
from groundup.train import TrainConfig, train
from groundup.train.pipeline import bubble_fraction, check_pp, merge_groups
from tests.test_distributed import COMMON, STEPS, assert_weights_close, losses, rewind, summary
from tests.train_helpers import env, metrics, shared_shards, tiny_config

MODEL = ["model.n_layers=4", "model.tie_embeddings=false", "train.seq_len=32", "train.device=cpu"]


TIED = ["model.n_layers=4", "model.tie_embeddings=true", "train.seq_len=32", "train.device=cpu"]
WORKER = Path(__file__).parent / "pp_tied_worker.py"


def torchrun(n: int, *args: str, worker: bool = False) -> None:
    what = [str(WORKER)] if worker else ["-m", "groundup", "train"]  # the worker: `train` that checks tied copies
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
           *what, *args, "train.threads=1", "--quiet"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    shards = shared_shards(tmp_path_factory)[0]
    run = tmp_path_factory.mktemp("pp") / "single"
    train(tiny_config(shards, *COMMON, *MODEL), run)
    return shards, run


@pytest.fixture(scope="module")
def single_tied(tmp_path_factory):
    shards = shared_shards(tmp_path_factory)[0]
    run = tmp_path_factory.mktemp("pp") / "single-tied"
    train(tiny_config(shards, *COMMON, *TIED), run)
    return shards, run


def pipelined(shards, run, n: int, batch: int, *options: str, model=MODEL, worker: bool = False) -> dict:
    """A fresh pipelined run; returns its summary after checking it took the reference's 10 steps."""
    torchrun(n, "--out", str(run), f"data.shards={shards}", *model, *COMMON, "schedule.peak_lr=2e-3", "log.every=1",
             "eval.every=0", f"train.batch_size={batch}", "distributed.strategy=fsdp", *options, worker=worker)
    return summary(run)


def assert_matches(run, ref, first: int = 1) -> None:
    """Losses within 1e-5 of the reference's from step `first` on, final weights close (printed with -s)."""
    a, b = losses(run, first), losses(ref, first)
    assert len(a) == len(b) == STEPS - first + 1
    assert a == pytest.approx(b, abs=1e-5)
    assert_weights_close(run, ref)
    print(f"\n{run.name} vs one process: largest loss difference {max(abs(x - y) for x, y in zip(a, b)):.3g}")


def bubble(run) -> float:
    """The theoretical bubble every logged step carries (the same on all), once the measured idle shares are checked."""
    steps = metrics(run)[0]
    assert all(0 <= s["pp_idle"] < 1 for s in steps)
    assert len({s["pp_bubble"] for s in steps}) == 1
    return steps[0]["pp_bubble"]


def test_two_stages_1f1b_match_one_process_and_resume_elsewhere(single, tmp_path):
    shards, ref = single
    run = tmp_path / "pp2"
    s = pipelined(shards, run, 2, 4, "distributed.pp=2", "distributed.pp_schedule=1f1b")
    assert (s["pp"], s["world_size"], s["processes"]) == (2, 1, 2)
    assert_matches(run, ref)
    assert bubble(run) == s["pp_bubble"] == pytest.approx(1 / 3)  # (p-1)/(m+p-1), m = pp_microbatches = 0 -> pp
    step = run / "checkpoints" / f"step_{STEPS:07d}"
    assert read_checkpoint_meta(step)["sharded"]["pp"] == 2
    # Each stage wrote its own shards under the one-process model's names: the consolidated model has them all.
    whole = load_file(ref / "checkpoints" / step.name / "model.safetensors")
    assert set(load_file(step / "model.safetensors")) == set(whole)

    # The PP checkpoint of step 5, resumed by one process, takes the same steps 6-10.
    rewind(run, tmp_path / "pp-then-single", 5)
    train(tiny_config(shards, *COMMON, *MODEL, "distributed.pp=1"), tmp_path / "pp-then-single", resume=True)
    assert_matches(tmp_path / "pp-then-single", ref, 6)


def test_gpipe_with_gradient_accumulation_matches_and_resumes_in_place(single, tmp_path):
    """2 loader batches of 2 per step, 4 pipeline micro-batches of 1 row; then its own shards, resumed."""
    shards, ref = single
    run = tmp_path / "gpipe"
    pipelined(shards, run, 2, 2, "train.grad_accum=2", "distributed.pp=2", "distributed.pp_schedule=gpipe",
              "distributed.pp_microbatches=2")
    assert_matches(run, ref)
    assert bubble(run) == pytest.approx(1 / 5)  # m = 2 loader batches x 2 = 4
    rewind(run, tmp_path / "gpipe-again", 5)
    torchrun(2, "--resume", str(tmp_path / "gpipe-again"))
    assert losses(tmp_path / "gpipe-again", 6) == pytest.approx(losses(run, 6), abs=1e-6)


def test_pp2_x_dp2_on_four_processes(single, tmp_path):
    shards, ref = single
    run = tmp_path / "pp2dp2"
    s = pipelined(shards, run, 4, 2, "distributed.pp=2", "distributed.pp_microbatches=2")
    assert (s["pp"], s["world_size"], s["processes"]) == (2, 2, 4)
    assert_matches(run, ref)
    sharded = read_checkpoint_meta(run / "checkpoints" / f"step_{STEPS:07d}")["sharded"]
    assert (sharded["processes"], sharded["pp"]) == (4, 2)


def test_interleaved_1f1b_two_virtual_stages_per_process(single, tmp_path):
    shards, ref = single
    run = tmp_path / "interleaved"
    pipelined(shards, run, 2, 4, "distributed.pp=2", "distributed.pp_schedule=interleaved_1f1b")
    assert_matches(run, ref)
    assert bubble(run) == pytest.approx(1 / 5)  # (p-1)/(v*m+p-1) = 1/(2*2+1)

    # The one-process checkpoint of step 5 (a full state) resumed with 2 stages on each process.
    rewind(ref, tmp_path / "single-then-pp", 5)
    torchrun(2, "--resume", str(tmp_path / "single-then-pp"), "distributed.strategy=fsdp", "distributed.pp=2",
             "distributed.pp_schedule=interleaved_1f1b")
    assert summary(tmp_path / "single-then-pp")["pp"] == 2
    assert_matches(tmp_path / "single-then-pp", ref, 6)


@pytest.mark.parametrize("processes, batch, options", [
    (2, 4, []),
    (4, 2, ["distributed.pp_microbatches=2"]),  # PP 2 x FSDP 2: the copies' shards are summed shard by shard
], ids=["pp2", "pp2-dp2"])
def test_tied_embeddings_two_stages_match_one_process_and_load_into_one(single_tied, tmp_path, processes, batch,
                                                                        options):
    """The first and last stage each hold `embed.weight`; their gradients are summed, so both copies stay equal."""
    shards, ref = single_tied
    run = tmp_path / "pp2-tied"
    pipelined(shards, run, processes, batch, "distributed.pp=2", "distributed.pp_schedule=1f1b", *options,
              model=TIED, worker=True)
    assert_matches(run, ref)
    # After the 10th update both ends' copies are bit-identical (each process compared with its partner).
    diffs = [json.loads((run / f"tied_diff_{r}.json").read_text()) for r in range(processes)]
    assert diffs == [[True, 0.0]] * processes
    step = run / "checkpoints" / f"step_{STEPS:07d}"
    names = set(load_file(step / "model.safetensors"))
    assert "embed.weight" in names and "lm_head.weight" not in names  # one name, the one-process model's
    assert names == set(load_file(ref / "checkpoints" / step.name / "model.safetensors"))

    if processes == 4:
        return
    # Its step-5 checkpoint, resumed by one process (tied), takes the same steps 6-10.
    rewind(run, tmp_path / "pp-tied-then-single", 5)
    train(tiny_config(shards, *COMMON, *TIED, "distributed.pp=1"), tmp_path / "pp-tied-then-single", resume=True)
    assert_matches(tmp_path / "pp-tied-then-single", ref, 6)


@pytest.mark.parametrize("options", [
    ["distributed.pp_schedule=1f1b"],
    # 4 stages of one block; each splits the sequence over its tp pair and gathers it back for the next stage
    ["distributed.pp_schedule=interleaved_1f1b", "distributed.sequence_parallel=true"],
], ids=["1f1b", "interleaved-sequence-parallel"])
def test_pp2_x_tp2_on_four_processes(single_tied, tmp_path, options):
    """A (pp 2, dp 1, tp 2) mesh: each stage's blocks split over its tp pair; tied embeddings on top."""
    shards, ref = single_tied
    run = tmp_path / "pp2tp2"
    s = pipelined(shards, run, 4, 4, "distributed.pp=2", "distributed.tp=2", *options, model=TIED)
    assert (s["pp"], s["tp"], s["world_size"], s["processes"]) == (2, 2, 1, 4)
    assert_matches(run, ref)
    step = run / "checkpoints" / f"step_{STEPS:07d}"
    # Every stage's split projections are named, so the consolidated model holds only fused names.
    assert sorted(read_checkpoint_meta(step)["sharded"]["split_projections"]) == sorted(
        f"blocks.{i}.{p}" for i in range(4) for p in ("attn.qkv_proj", "mlp.gate_up_proj"))
    assert set(load_file(step / "model.safetensors")) == set(load_file(ref / "checkpoints" / step.name /
                                                                       "model.safetensors"))
    if "distributed.pp_schedule=1f1b" in options:  # its step-5 shards, resumed by one process
        rewind(run, tmp_path / "pp-tp-then-single", 5)
        train(tiny_config(shards, *COMMON, *TIED, "distributed.pp=1", "distributed.tp=1"),
              tmp_path / "pp-tp-then-single", resume=True)
        assert_matches(tmp_path / "pp-tp-then-single", ref, 6)


def test_bubble_fraction():
    assert bubble_fraction("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction("gpipe", 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction("interleaved_1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    assert bubble_fraction("1f1b", 1, 8) == 0.0


def test_merged_optimizer_groups_name_every_stage_once():
    a = {"param_groups": [{"params": ["embed.weight", "blocks.0.w"], "lr": 1.0, "weight_decay": 0.1},
                          {"params": ["blocks.0.norm"], "lr": 1.0, "weight_decay": 0.0}], "scalars": {}}
    b = {"param_groups": [{"params": ["blocks.1.w", "lm_head.weight"], "lr": 1.0, "weight_decay": 0.1},
                          {"params": ["norm.weight"], "lr": 1.0, "weight_decay": 0.0}], "scalars": {"x": {"step": 1}}}
    merged = merge_groups([a, a, b, b])  # two data-parallel processes per stage
    assert [g["params"] for g in merged["param_groups"]] == [
        ["embed.weight", "blocks.0.w", "blocks.1.w", "lm_head.weight"], ["blocks.0.norm", "norm.weight"]]
    assert merged["scalars"] == {"x": {"step": 1}}


@pytest.mark.parametrize("overrides, key, message", [
    (["distributed.pp=2"], "distributed.pp", "'fsdp' or 'hsdp'"),
    (["distributed.strategy=fsdp", "distributed.pp=0"], "distributed.pp", "positive integer"),
    (["distributed.strategy=fsdp", "distributed.pp=2", "distributed.ep=2"], "distributed.pp", "distributed.ep > 1"),
    (["distributed.strategy=fsdp", "distributed.pp=4", "distributed.pp_microbatches=2"],
     "distributed.pp_microbatches", ">= distributed.pp"),
    (["distributed.strategy=fsdp", "distributed.pp=2", "distributed.pp_virtual_stages=2"],
     "distributed.pp_virtual_stages", "interleaved_1f1b"),
    (["distributed.strategy=fsdp", "distributed.pp=2", "distributed.pp_schedule=interleaved_1f1b",
      "distributed.pp_virtual_stages=1"], "distributed.pp_virtual_stages", ">= 2"),
])
def test_config_refuses_bad_pipelines(overrides, key, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config(TrainConfig, None, overrides)
    assert e.value.key == key


@pytest.mark.parametrize("overrides, key, message", [
    (["model.n_layers=3"], "distributed.pp", "must divide model.n_layers"),
    (["distributed.pp_schedule=interleaved_1f1b"], "distributed.pp_virtual_stages", "2 x 2 must divide"),
    (["train.batch_size=3"], "distributed.pp_microbatches", "must divide train.batch_size"),
    (["eval.every=5"], "eval.every", "not pipelined"),
    (["eval.at_end=true"], "eval.at_end", "not pipelined"),
])
def test_layouts_that_cannot_be_pipelined_name_the_key(overrides, key, message):
    base = ["model.n_layers=2", "model.tie_embeddings=false", "eval.every=0", "eval.at_end=false",
            "train.batch_size=4", "distributed.strategy=fsdp", "distributed.pp=2"]
    cfg = load_config(TrainConfig, None, [*base, *overrides])
    with pytest.raises(ConfigError, match=message) as e:
        check_pp(cfg, cfg.model)
    assert e.value.key == key
