"""Sharded (DCP) checkpoints in one process: asynchronous writes, a crash mid-write, readers, safe metadata.

An FSDP2 run on a one-process gloo group takes the sharded code path end to end (DCP shards, the
consolidated model directory, meta.json, the pointer) without torchrun, so these run in-process.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file

from groundup.errors import CheckpointError
from groundup.layout import checkpoint_problem, find_intact_checkpoint, read_latest, resolve_model_dir
from groundup.quant.load import load_model
from groundup.train import checkpoint as ckpt
from groundup.train import dcp, loop, train
from tests.train_helpers import metrics, one_process_fsdp, tiny_config

STEPS = ["train.max_steps=6", "checkpoint.every=2", "checkpoint.keep_last=5", "eval.at_end=false",
         "distributed.strategy=fsdp", "train.device=cpu"]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    yield from one_process_fsdp(tmp_path_factory)


def run_sharded(monkeypatch, make_dist, cfg, out, resume=False) -> dict:
    monkeypatch.setattr(loop, "init_distributed", lambda _cfg, _model_cfg=None: make_dist())
    return train(cfg, out, resume=resume)


def final_weights(run, step=6):
    return load_file(run / "checkpoints" / f"step_{step:07d}" / "model.safetensors")


def test_async_write_is_invisible_until_complete_and_a_crash_resumes_exactly(sharded, monkeypatch, tmp_path):
    shards, make_dist = sharded
    cfg = tiny_config(shards, *STEPS, "checkpoint.async_save=true")
    reference = tmp_path / "reference"
    run_sharded(monkeypatch, make_dist, tiny_config(shards, *STEPS), reference)  # synchronous saves

    # Hold step 4's write after its shards are on disk until training has gone on to step 5, then copy
    # the run directory: what a crash at that moment would leave behind.
    run, crashed = tmp_path / "run", tmp_path / "crashed"
    finish, seen = ckpt.finish_sharded, {}

    def held(tmp, step, *args, **kwargs):
        if step == 4:
            deadline = time.time() + 60
            while not any(r["step"] == 5 for r in metrics(run)[0]) and time.time() < deadline:
                time.sleep(0.01)
            seen["tmp"] = sorted(p.name for p in tmp.iterdir())
            shutil.copytree(run, crashed)
        return finish(tmp, step, *args, **kwargs)

    monkeypatch.setattr(ckpt, "finish_sharded", held)
    summary = run_sharded(monkeypatch, make_dist, cfg, run)
    # The seconds the loop waited in each save (step 4's only for the copy: its write was held until step 5).
    assert summary["checkpoint_async"] is True and [s["step"] for s in summary["checkpoint_saves"]] == [2, 4, 6]
    assert all(isinstance(s["blocked_s"], float) and s["blocked_s"] >= 0 for s in summary["checkpoint_saves"])
    assert {".metadata", "__0_0.distcp"} <= set(seen["tmp"]) and "meta.json" not in seen["tmp"]
    # Training went on (step 5 logged) while step 4 was incomplete, and nothing vouched for it.
    assert any(r["step"] == 5 for r in metrics(crashed)[0])
    assert read_latest(crashed) == "step_0000002"
    assert not (crashed / "checkpoints" / "step_0000004").exists()
    assert find_intact_checkpoint(crashed) == crashed / "checkpoints" / "step_0000002"
    # Uninterrupted, the asynchronous run equals the synchronous one; resumed, so does the crashed one.
    assert read_latest(run) == "step_0000006" and checkpoint_problem(run / "checkpoints" / "step_0000004") is None
    monkeypatch.setattr(ckpt, "finish_sharded", finish)
    run_sharded(monkeypatch, make_dist, cfg, crashed, resume=True)
    for other in (run, crashed):
        a, b = final_weights(other), final_weights(reference)
        assert all(torch.equal(a[k], b[k]) for k in b)
        assert [r["loss"] for r in metrics(other)[0]] == [r["loss"] for r in metrics(reference)[0]]


def test_a_failed_write_leaves_the_previous_checkpoint_and_stops_the_run(sharded, monkeypatch, tmp_path):
    shards, make_dist = sharded
    finish = ckpt.finish_sharded

    def disk_full(tmp, step, *args, **kwargs):
        if step == 4:
            raise OSError(28, "No space left on device")
        return finish(tmp, step, *args, **kwargs)

    monkeypatch.setattr(ckpt, "finish_sharded", disk_full)
    run = tmp_path / "run"
    with pytest.raises(CheckpointError, match="disk full writing .*step_0000004: No space left.*--resume"):
        run_sharded(monkeypatch, make_dist, tiny_config(shards, *STEPS, "checkpoint.async_save=true"), run)
    assert read_latest(run) == "step_0000002"
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name != "latest"] == ["step_0000002"]  # no debris


def test_readers_use_a_sharded_checkpoint_and_catch_a_damaged_shard(sharded, monkeypatch, tmp_path):
    shards, make_dist = sharded
    run = tmp_path / "run"
    run_sharded(monkeypatch, make_dist, tiny_config(shards, *STEPS), run)
    step = resolve_model_dir(run)
    assert step.name == "step_0000006" and (step / ".metadata").is_file()
    model = load_model(step)  # generate, export and eval read this model directory
    full = dcp.consolidate(step, {})
    assert all(torch.equal(model.state_dict()[k], full[k]) for k in full)

    shard = step / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])  # truncated
    assert "__0_0.distcp does not match its checksum" in checkpoint_problem(step)
    with pytest.raises(CheckpointError, match="unusable"):
        resolve_model_dir(step)
    assert find_intact_checkpoint(run, lambda _: None).name == "step_0000004"


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_dcp_metadata_is_unpickled_without_running_code(sharded, monkeypatch, tmp_path):
    shards, make_dist = sharded
    run = tmp_path / "run"
    run_sharded(monkeypatch, make_dist, tiny_config(shards, *STEPS, "train.max_steps=2"), run)
    step = run / "checkpoints" / "step_0000002"
    assert "model/embed.weight" in dcp.SafeReader(step).read_metadata().state_dict_metadata

    (step / ".metadata").write_bytes(pickle.dumps(_Payload()))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="posix.system is not part of DCP's metadata|os.system"):
        dcp.read_full(step)
    assert not (tmp_path / "pwned").exists()
    meta = json.loads((step / "meta.json").read_text())
    assert meta["sharded"]["format"] == dcp.FORMAT
