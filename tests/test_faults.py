"""Faults a careless or hostile user causes, each refused or survived with a clear message.

One test per cause the reliability probe found: a verb replacing what it did not create, two writers
on one run, a resume with no intact checkpoint, readers trusting a damaged checkpoint, runs that never
end, sizes that are never checked. (Bad input files are in test_fuzz_inputs.py.)
"""

from __future__ import annotations

import json
import math
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from groundup.config import from_dict, load_config
from groundup.errors import CheckpointError, ConfigError, DataError, TrainingError
from groundup.infer import Generator
from groundup.io import writer_lock
from groundup.layout import file_digest, resolve_model_dir
from groundup.model import ModelConfig
from groundup.report import write_report
from groundup.train import TrainConfig, train
from infer_helpers import small_tokenizer
from train_helpers import env, groundup_cmd, metrics, run_cli, shared_shards, tiny_config, write_config


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return shared_shards(tmp_path_factory)[0]


# ----------------------------------------------------------------------------- 1. never replace


def test_report_refuses_other_directories_and_files_it_did_not_write(tmp_path, shards):
    (tmp_path / "notes").mkdir()
    with pytest.raises(DataError, match="nothing to report"):
        write_report(tmp_path / "notes")
    run = tmp_path / "run"
    train(tiny_config(shards, "train.max_steps=2", "eval.at_end=false"), run)
    (run / "report.md").write_text("a curation report someone wrote\n")
    with pytest.raises(DataError, match="was not written by 'groundup report'"):
        write_report(run)
    assert (run / "report.md").read_text() == "a curation report someone wrote\n"
    assert write_report(run, overwrite=True).read_text().startswith("<!-- written by groundup report -->")
    write_report(run)  # its own report is refreshed without --overwrite
    result = run_cli("report", str(tmp_path / "notes"), check=False)
    assert result.returncode == 2 and "nothing to report" in result.stderr and "Traceback" not in result.stderr


def test_data_sample_refuses_to_replace_files(tmp_path):
    run_cli("data", "sample", "--out", str(tmp_path), "--domains", "math", "--math-count", "5")
    before = (tmp_path / "math-synthetic.jsonl").read_bytes()
    result = run_cli("data", "sample", "--out", str(tmp_path), "--domains", "math", "--math-count", "9", check=False)
    assert result.returncode == 2 and "already exists" in result.stderr
    assert (tmp_path / "math-synthetic.jsonl").read_bytes() == before


# ----------------------------------------------------------------------------- 2. one writer per run


def test_one_writer_per_run_directory(tmp_path, shards):
    # Far more steps than the checks take (the first writer is killed at the end): it must still be running.
    cfg = write_config(tmp_path / "c.toml", tiny_config(shards, "train.max_steps=1000000", "checkpoint.every=1000000",
                                                         "eval.at_end=false"))
    run = tmp_path / "run"
    first = subprocess.Popen(groundup_cmd("train", "--config", str(cfg), "--out", str(run), "--quiet"), env=env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (run / "metrics.jsonl").exists() and time.time() < deadline:
            time.sleep(0.05)
        for args in (("--config", str(cfg), "--out", str(run)), ("--resume", str(run))):
            second = run_cli("train", *args, "--quiet", check=False)
            assert second.returncode == 2, second.stderr
            assert f"being written by another process (pid {first.pid})" in second.stderr
    finally:
        first.kill()
        first.wait()
    # A killed writer leaves no stale lock: the run resumes at once.
    with writer_lock(run):
        pass


# ----------------------------------------------------------------------------- 3 + 4. damaged checkpoints


def _corrupt(path):
    path.write_bytes(path.read_bytes()[:-7] + b"garbage")


def test_resume_without_an_intact_checkpoint_refuses_and_keeps_the_history(tmp_path, shards):
    run = tmp_path / "run"
    cfg = tiny_config(shards, "train.max_steps=4", "checkpoint.every=2", "eval.at_end=false")
    train(cfg, run)
    history = (run / "metrics.jsonl").read_bytes()
    for step in ("step_0000002", "step_0000004"):
        _corrupt(run / "checkpoints" / step / "model.safetensors")
    with pytest.raises(CheckpointError, match="no intact checkpoint to resume from"):
        train(cfg, run, resume=True)
    assert (run / "metrics.jsonl").read_bytes() == history


def test_every_reader_verifies_a_checkpoint(tmp_path, shards, capsys):
    run = tmp_path / "run"
    train(tiny_config(shards, "train.max_steps=4", "checkpoint.every=2", "eval.at_end=false"), run)
    _corrupt(run / "checkpoints" / "step_0000004" / "model.safetensors")
    assert resolve_model_dir(run) == run / "checkpoints" / "step_0000002"  # falls back, as resume does
    assert "step_0000004 is unusable" in capsys.readouterr().out
    Generator.from_checkpoint(run)
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        Generator.from_checkpoint(run / "checkpoints" / "step_0000004")
    result = run_cli("export", "hf", "--checkpoint", str(run / "checkpoints" / "step_0000004"), "--out",
                     str(tmp_path / "hf"), check=False)
    assert result.returncode == 2 and "does not match its checksum" in result.stderr
    assert not (tmp_path / "hf").exists()
    (run / "checkpoints" / "latest").write_bytes(b"\xff\xfe not utf-8")  # a damaged pointer: fall back
    assert resolve_model_dir(run) == run / "checkpoints" / "step_0000002"


# ----------------------------------------------------------------------------- 5. runs that never end


def test_non_finite_rates_are_refused():
    for key in ("schedule.peak_lr=inf", "schedule.peak_lr=nan", "optim.weight_decay=inf"):
        with pytest.raises(ConfigError, match="expected a finite number"):
            load_config(TrainConfig, None, [key])


def test_a_diverging_run_stops_after_bounded_rollbacks_and_never_saves_nan(tmp_path, shards):
    run = tmp_path / "run"
    cfg = tiny_config(shards, "train.max_steps=200", "checkpoint.every=2", "schedule.peak_lr=1000",
                      "schedule.warmup_steps=0", "stability.rollback_after=2", "stability.max_rollbacks=3",
                      "optim.grad_clip=0", "eval.at_end=false")
    began = time.time()
    with pytest.raises(TrainingError, match="training diverged at step .*Rollbacks at steps"):
        train(cfg, run)
    assert time.time() - began < 60
    steps, events = metrics(run)
    assert [e["event"] for e in events].count("rollback") <= 3 and events[-1]["event"] == "diverged"
    assert len(steps) + len(events) < 100
    for step_dir in (run / "checkpoints").glob("step_*"):
        weights = load_file(step_dir / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in weights.values()), step_dir.name


# ----------------------------------------------------------------------------- 6. sizes


@pytest.mark.parametrize("override, message", [
    ({"n_layers": 10**9}, "n_layers = 1000000000: expected at most 4,096"),
    ({"vocab_size": 10**10}, "vocab_size = 10000000000: expected at most"),
    ({"d_model": 65536, "n_heads": 512, "n_layers": 4000}, "would have about 3.4.e\\+13 parameters"),
])
def test_sizes_are_bounded_before_anything_is_built(override, message):
    began = time.time()
    with pytest.raises(ConfigError, match=message):
        from_dict(ModelConfig, {"preset": "tiny", **override})
    assert time.time() - began < 1


def test_a_model_larger_than_the_machine_is_refused_before_allocating(tmp_path):
    (tmp_path / "model.toml").write_text('name = "huge"\nvocab_size = 32000\nd_model = 16384\nn_layers = 400\n'
                                         "n_heads = 128\n")
    (tmp_path / "model.safetensors").write_bytes(b"")
    small_tokenizer().save(tmp_path / "tokenizer")
    result = run_cli("generate", "--checkpoint", str(tmp_path), "--prompt", "hi", check=False)
    assert result.returncode == 2 and "GiB for its weights" in result.stderr, result.stderr
    result = run_cli("model", "info", str(tmp_path / "model.toml"), "n_layers=100000", check=False)
    assert result.returncode == 2 and "n_layers = 100000: expected at most 4,096" in result.stderr, result.stderr
    assert math.isfinite(from_dict(ModelConfig, {"preset": "clover-12b"}).approx_params())


def test_a_huge_tokenizer_vocabulary_is_refused_before_training(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"text": "hello world"}\n')
    result = run_cli("tokenizer", "train", "--input", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "tok"),
                     "--vocab-size", "1000000000", check=False)
    assert result.returncode == 2 and "vocab_size = 1000000000: expected at most 2,097,152" in result.stderr
