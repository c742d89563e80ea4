"""Exact resume: SIGKILL at any moment, SIGTERM, corrupt checkpoints, incompatible configs."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from groundup.errors import CheckpointError
from groundup.train import train
from tests.train_helpers import env, groundup_cmd, metrics, run_cli, shared_shards, tiny_config, write_config

STEPS = 30
BASE = [f"train.max_steps={STEPS}", "checkpoint.every=4", "checkpoint.keep_last=3", "eval.at_end=false"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The shards, the config, and the uninterrupted reference run."""
    shards = shared_shards(tmp_path_factory)[0]
    root = tmp_path_factory.mktemp("resume")
    cfg = tiny_config(shards, *BASE)
    train(cfg, root / "reference")
    return cfg, write_config(root / "config.toml", cfg), root / "reference"


def final_dir(run):
    return run / "checkpoints" / f"step_{STEPS:07d}"


def assert_same_run(run, reference):
    """Bit-identical final weights and optimizer state, and the identical loss sequence."""
    a, b = load_file(final_dir(run) / "model.safetensors"), load_file(final_dir(reference) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa = torch.load(final_dir(run) / "optimizer.pt", weights_only=True)["state"]
    ob = torch.load(final_dir(reference) / "optimizer.pt", weights_only=True)["state"]
    assert all(torch.equal(oa[p][k], ob[p][k]) for p in ob for k in ob[p])
    losses = [(s["step"], s["loss"]) for s in metrics(run)[0]]
    assert losses == [(s["step"], s["loss"]) for s in metrics(reference)[0]]


def start(*args):
    return subprocess.Popen(groundup_cmd("train", *args, "--quiet"), env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_steps(run, proc, n, resumes=0, timeout=120.0):
    """Block until metrics.jsonl of `run` logs step n after its `resumes`-th resume (or the process ends)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        path = run / "metrics.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")] if path.exists() else []
        starts = [i for i, x in enumerate(lines) if x.get("event") == "resume"]
        if len(starts) >= resumes:
            since = lines[starts[resumes - 1] + 1 :] if resumes else lines
            if any(x.get("step", 0) >= n for x in since if "loss" in x):
                return
        time.sleep(0.005)


def test_sigkill_at_any_moment_then_resume_is_bit_identical(setup, tmp_path):
    cfg, cfg_file, reference = setup
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    run = tmp_path / "run"
    proc = start("--config", str(cfg_file), "--out", str(run))
    for kills, target in enumerate(sorted(rng.sample(range(2, STEPS - 4), 2))):  # each at a random moment
        wait_for_steps(run, proc, target, resumes=kills)
        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc = start("--resume", str(run))
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    events = [e["event"] for e in metrics(run)[1]]
    # Two kills between the same pair of checkpoints resume from the same one twice, and the second
    # resume cuts the metrics back to that checkpoint, the first resume's line included.
    assert 1 <= events.count("resume") <= 2, f"kill seed {seed}"
    assert_same_run(run, reference)


def test_sigterm_saves_and_exits_cleanly_then_resumes(setup, tmp_path):
    cfg, cfg_file, reference = setup
    run = tmp_path / "run"
    proc = start("--config", str(cfg_file), "--out", str(run))
    wait_for_steps(run, proc, 6)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in out and "Traceback" not in err
    steps, events = metrics(run)
    assert events[-1]["event"] == "interrupt" and events[-1]["step"] == steps[-1]["step"] < STEPS
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{steps[-1]['step']:07d}"  # saved at the step it stopped after
    run_cli("train", "--resume", str(run), "--quiet")
    assert_same_run(run, reference)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(setup, tmp_path, capsys):
    cfg, _, reference = setup
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    weights = final_dir(run) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    # Debris a kill can leave behind is never taken for a checkpoint.
    (run / "checkpoints" / ".step_0000032.tmp-abc").mkdir()
    train(cfg, run, resume=True)
    printed = capsys.readouterr().out
    assert f"step_{STEPS:07d} is unusable (model.safetensors does not match its checksum" in printed
    assert metrics(run)[1][-1] == {"event": "resume", "step": 28, "from": "step_0000028", "world_size": 1,
                                   "changed": []}
    assert_same_run(run, reference)  # steps 29 and 30 were taken again, identically


def test_incomplete_checkpoint_and_dangling_pointer(setup, tmp_path, capsys):
    cfg, _, reference = setup
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (final_dir(run) / "meta.json").unlink()  # killed while writing: never complete
    (run / "checkpoints" / "latest").write_text("step_0000099\n")
    train(cfg, run, resume=True)
    printed = capsys.readouterr().out
    assert "names step_0000099, which does not exist" in printed and "no meta.json" in printed
    assert_same_run(run, reference)


def test_incompatible_config_is_refused_naming_the_keys(setup, tmp_path):
    cfg, _, reference = setup
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    changed = tiny_config(cfg.data.shards, *BASE, "model.d_model=32", "optim.name=lion")
    with pytest.raises(CheckpointError, match=r"model\.d_model: 64 -> 32.*optim\.name: 'adamw' -> 'lion'"):
        train(changed, run, resume=True)
    result = run_cli("train", "--resume", str(run), "model.n_layers=3", check=False)
    assert result.returncode == 2 and "model.n_layers: 2 -> 3" in result.stderr
    # Allowed changes (a longer run, another cadence) continue the run and are logged.
    longer = tiny_config(cfg.data.shards, *BASE[1:], f"train.max_steps={STEPS + 3}")
    summary = train(longer, run, resume=True)
    assert summary["steps"] == STEPS + 3
    resume = metrics(run)[1][-1]
    assert resume["event"] == "resume" and resume["changed"] == [f"train.max_steps: {STEPS} -> {STEPS + 3}"]


@pytest.mark.parametrize("extra", [
    ["model.dropout=0.1", "model.n_experts=4", "model.moe_top_k=2", "train.grad_accum=2", "eval.every=3",
     "optim.name=muon"],
    ["precision.mode=bf16-weights", "optim.name=lion", "model.z_loss_coef=1e-4", "stability.spike_min_history=2"],
], ids=["dropout-moe-muon-accum-eval", "bf16weights-lion-zloss"])
def test_resume_is_exact_with_every_stateful_feature(setup, tmp_path, extra):
    """Dropout RNG, MoE balancing biases, Muon/Lion state, evaluation in between, bf16 master weights."""
    cfg, _, _ = setup
    steps = ["train.max_steps=8", "checkpoint.every=4", "eval.at_end=false"]
    full = tmp_path / "full"
    train(tiny_config(cfg.data.shards, *steps, *extra), full)
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_0000008")
    (resumed / "checkpoints" / "latest").write_text("step_0000004\n")
    train(tiny_config(cfg.data.shards, *steps, *extra), resumed, resume=True)
    a = load_file(resumed / "checkpoints" / "step_0000008" / "model.safetensors")
    b = load_file(full / "checkpoints" / "step_0000008" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert [s["loss"] for s in metrics(resumed)[0]] == [s["loss"] for s in metrics(full)[0]]
