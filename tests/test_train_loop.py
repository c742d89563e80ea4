"""The training loop end to end: the CLI, the run directory contract, bad input, accumulation."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from groundup.errors import CheckpointError, ConfigError, DataError
from groundup.layout import LATEST_POINTER, resolve_model_dir
from groundup.quant.load import load_model
from groundup.train import train
from tests.train_helpers import make_shards, metrics, run_cli, shared_shards, tiny_config

STEP_KEYS = {"step", "tokens", "loss", "lr", "grad_norm", "grad_norm_clipped", "tokens_per_sec", "mfu", "elapsed_s"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return shared_shards(tmp_path_factory)[0]


def test_cli_trains_tiny_and_writes_the_run_directory(shards, tmp_path):
    run = tmp_path / "run"
    out = run_cli("train", "--out", str(run), f"data.shards={shards}", "train.batch_size=4", "train.seq_len=64",
                  "train.max_steps=40", "schedule.peak_lr=3e-3", "checkpoint.every=10", "eval.every=20",
                  "eval.max_batches=2", "log.every=5", "--quiet")
    assert "40 steps" in out.stdout and "val bpb" in out.stdout
    steps, events = metrics(run)
    assert [s["step"] for s in steps] == [1, 5, 10, 15, 20, 25, 30, 35, 40]  # the first step, then every 5
    assert all(STEP_KEYS <= set(s) for s in steps)
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.5  # it learns
    assert steps[-1]["tokens"] == 40 * 4 * 64
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "val_bpb" in line]
    assert [e["step"] for e in evals] == [20, 40]
    assert {"val_loss", "val_bpb", "val_bpb/text", "val_bpb/math"} <= set(evals[-1])
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]

    # The checkpoint contract: model directories, weights_only states, checksums, pointer.
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.is_dir()) == [f"step_{s:07d}" for s in (10, 20, 30, 40)]
    assert (ckpts / LATEST_POINTER).read_text().strip() == "step_0000040"
    assert resolve_model_dir(run) == ckpts / "step_0000040"
    model = load_model(ckpts / "step_0000040")
    assert model.cfg.vocab_size == 384  # matched to the tokenizer
    for name in ("optimizer.pt", "loader.pt", "trainer.pt"):
        torch.load(ckpts / "step_0000040" / name, weights_only=True)
    meta = json.loads((ckpts / "step_0000040" / "meta.json").read_text())
    assert set(meta["files"]) == {"model.safetensors", "model.toml", "optimizer.pt", "loader.pt", "trainer.pt"}
    assert meta["step"] == 40 and meta["config"]["train"]["max_steps"] == 40
    assert (run / "tokenizer" / "tokenizer.json").is_file()
    assert "max_steps = 40" in (run / "config.toml").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["val_bpb"] == pytest.approx(evals[-1]["val_bpb"])


def test_rotation_keeps_recent_and_every_nth(shards, tmp_path):
    cfg = tiny_config(shards, "train.max_steps=9", "checkpoint.every=1", "checkpoint.keep_last=2",
                      "checkpoint.keep_every=4", "eval.at_end=false")
    train(cfg, tmp_path / "run")
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["step_0000004", "step_0000008", "step_0000009"]


def test_gradient_accumulation_averages_over_tokens(shards, tmp_path):
    """4 sequences at once, or 2 micro-batches of 2: the same steps (fp32 rounding apart).

    One domain, so both read the same windows (domain draws depend on the micro-batch size)."""
    base = ["train.max_steps=6", "eval.at_end=false", "data.domain_weights={text = 1.0}"]
    one = train(tiny_config(shards, *base), tmp_path / "one")
    two = train(tiny_config(shards, *base, "train.batch_size=2", "train.grad_accum=2"), tmp_path / "two")
    a, b = metrics(tmp_path / "one")[0], metrics(tmp_path / "two")[0]
    assert [x["loss"] for x in a] == pytest.approx([x["loss"] for x in b], abs=1e-5)
    assert one["tokens"] == two["tokens"]


@pytest.mark.parametrize("mode", ["bf16-autocast", "bf16-weights"])
def test_bf16_modes_learn_and_save_fp32_weights(shards, tmp_path, mode):
    summary = train(tiny_config(shards, "train.max_steps=12", f"precision.mode={mode}", "eval.at_end=false"),
                    tmp_path / "run")
    steps = metrics(tmp_path / "run")[0]
    assert summary["precision"] == mode
    assert steps[-1]["loss"] < steps[0]["loss"]
    model = load_model(tmp_path / "run" / "checkpoints" / "step_0000012")
    assert model.embed.weight.dtype == torch.float32  # the master weights, not the bf16 copy


def test_activation_checkpointing_takes_the_same_steps(shards, tmp_path):
    base = ["train.max_steps=3", "eval.at_end=false"]
    train(tiny_config(shards, *base), tmp_path / "plain")
    train(tiny_config(shards, *base, "train.grad_checkpointing=true"), tmp_path / "recompute")
    plain, recompute = metrics(tmp_path / "plain")[0], metrics(tmp_path / "recompute")[0]
    assert [s["loss"] for s in recompute] == pytest.approx([s["loss"] for s in plain], abs=1e-6)


def test_bf16_via_fp32_matches_bf16_arithmetic():
    """fp32 math on bf16 values, rounded once, is what a bf16 matmul with fp32 accumulation gives."""
    from groundup.train.precision import Bf16ViaFp32

    torch.manual_seed(0)
    a, b = torch.randn(64, 96).bfloat16(), torch.randn(96, 32).bfloat16()
    with Bf16ViaFp32():
        emulated = a @ b
    assert emulated.dtype == torch.bfloat16
    exact = (a.double() @ b.double()).bfloat16()
    assert (emulated.float() - exact.float()).abs().max() <= exact.float().abs().max() * 2**-7
    x = torch.randn(8, 96, requires_grad=True)
    w = torch.randn(32, 96, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), Bf16ViaFp32(autocast=True):
        y = torch.nn.functional.linear(x, w)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32


def test_bad_input_fails_early_with_a_clear_message(shards, tmp_path):
    with pytest.raises(ConfigError, match="data.shards"):
        train(tiny_config(""), tmp_path / "a")
    with pytest.raises(DataError, match="no index"):
        train(tiny_config(tmp_path / "nowhere"), tmp_path / "b")
    with pytest.raises(ConfigError, match="unknown key 'optim.learning_rate'"):
        tiny_config(shards, "optim.learning_rate=1")
    with pytest.raises(ConfigError, match="train.seq_len"):
        tiny_config(shards, "train.seq_len=1024")
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:  # asked for, not installed: refused before any write
        with pytest.raises(ConfigError, match="log.tensorboard = true needs the tensorboard package"):
            train(tiny_config(shards, "log.tensorboard=true"), tmp_path / "tb")
        assert not (tmp_path / "tb").exists()
    other_shards, other_tok = make_shards(tmp_path / "other", domains=("math",), vocab=300)
    with pytest.raises(DataError, match="tokenizer"):
        train(tiny_config(shards, f"data.tokenizer={other_tok}"), tmp_path / "c")
    # A damaged shard file (wrong size) is named.
    damaged = tmp_path / "damaged"
    import shutil

    shutil.copytree(other_shards, damaged)
    victim = next((damaged / "train").glob("*.bin"))
    victim.write_bytes(victim.read_bytes()[:-2])
    with pytest.raises(DataError, match="damaged"):
        train(tiny_config(damaged, "train.max_steps=1"), tmp_path / "d")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(DataError, match="not writable"):
            train(tiny_config(shards), locked / "run")
    # A directory that holds a run is never trained over.
    train(tiny_config(shards, "train.max_steps=1", "eval.at_end=false"), tmp_path / "done")
    with pytest.raises(DataError, match="already holds a training run"):
        train(tiny_config(shards, "train.max_steps=1"), tmp_path / "done")
    result = run_cli("train", "--out", str(tmp_path / "done"), f"data.shards={shards}", check=False)
    assert result.returncode == 2 and "already holds" in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(CheckpointError, match="not a training run"):
        train(tiny_config(shards), tmp_path / "never", resume=True)


def test_evaluate_reports_bits_per_byte_per_domain(shards, tmp_path):
    from groundup.tokens.shards import read_index
    from groundup.eval.perplexity import evaluate
    from groundup.tokenizer import Tokenizer

    train(tiny_config(shards, "train.max_steps=2", "eval.at_end=false"), tmp_path / "run")
    model = load_model(resolve_model_dir(tmp_path / "run"))
    tok = Tokenizer.load(tmp_path / "run" / "tokenizer")
    with_tok = evaluate(model, shards, seq_len=64, tokenizer=tok)
    index_bytes = evaluate(model, shards, seq_len=64)  # bytes from the shard index
    index = read_index(shards)
    assert set(with_tok["domains"]) == set(index["splits"]["val"]["domains"])
    assert with_tok["tokens"] == index["splits"]["val"]["tokens"]
    for name, r in with_tok["domains"].items():
        assert r["bytes"] == index["splits"]["val"]["domains"][name]["bytes"]
        assert r["bpb"] == pytest.approx(r["loss"] * r["tokens"] / (math.log(2) * r["bytes"]))
        assert index_bytes["domains"][name]["bpb"] == pytest.approx(r["bpb"], rel=1e-6)
    one = evaluate(model, shards, domain="math", seq_len=64, tokenizer=tok)
    assert list(one["domains"]) == ["math"] and one["bpb"] == pytest.approx(with_tok["domains"]["math"]["bpb"])
    by_path = evaluate(model, shards, seq_len=64, tokenizer=tmp_path / "run" / "tokenizer")
    assert by_path["bpb"] == pytest.approx(with_tok["bpb"])
    quick = evaluate(model, shards, seq_len=64, tokenizer=tok, max_batches=1, batch_size=2)
    assert 0 < quick["tokens"] < with_tok["tokens"] and math.isfinite(quick["bpb"])


def test_example_configs_load():
    from pathlib import Path

    from groundup.config import load_config
    from groundup.train import TrainConfig

    paths = sorted((Path(__file__).parents[1] / "configs").glob("train-*.toml"))
    assert len(paths) >= 3
    for path in paths:
        cfg = load_config(TrainConfig, path)
        assert cfg.data.shards and cfg.train.max_steps > 0, path
