"""A full disk, for real: a small tmpfs filled up. Every writer says so in one line naming the file (its final
path, not a temporary one), the command exits 2 without a traceback, what was complete before is intact and no
temporary file is left; once there is space again, the same command goes on (a run resumes from its last
checkpoint). Mounting a tmpfs needs root (as CI runs); elsewhere these tests skip."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file

from groundup.cli import main
from groundup.errors import DiskFullError
from groundup.io import atomic_dir, atomic_open, atomic_write_json, atomic_write_text, open_named, writing
from groundup.layout import read_latest
from train_helpers import TINY, one_process_fsdp, run_cli, shared_shards

NO_SPACE = os.strerror(errno.ENOSPC)


@pytest.fixture
def disk(tmp_path):
    """A 24 MB file system of its own."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Take all the free space but about `leave` bytes."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    with open(filler, "ab") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".tmp-" in p.name or ".old-" in p.name)


def one_error_line(result: subprocess.CompletedProcess, path: Path) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"error: disk full writing {path}: {NO_SPACE}"), lines[0]


# --- every writer in io.py, whichever library writes through it ---------------------------------------------------

def _torch(f):
    torch.save({"w": torch.ones(200_000)}, f)  # torch's zip writer swallows the error: "unexpected pos"


def _numpy(f):
    np.save(f, np.ones(200_000))  # numpy writes past the buffer (tofile): a short write without an errno


def _parquet(f):
    pq.write_table(pa.table({"x": np.arange(200_000)}), f, compression="none")


def _text(f):
    for _ in range(20_000):
        f.write("a line of text that fills the disk\n")


@pytest.mark.parametrize("write", [_torch, _numpy, _parquet, _text])
def test_atomic_open_names_the_file_and_keeps_the_old_one(disk, write):
    path = disk / "out" / "data.bin"
    atomic_write_text(path, "the old contents\n")
    fill(disk, leave=64 << 10)
    with pytest.raises(DiskFullError) as e:
        text = {"encoding": "utf-8"} if write is _text else {}
        with atomic_open(path, "w" if text else "wb", **text) as f:
            write(f)
    assert str(e.value).startswith(f"disk full writing {path}: {NO_SPACE}") and e.value.errno == errno.ENOSPC
    assert path.read_text() == "the old contents\n" and leftovers(disk) == []


def test_atomic_dir_names_the_file_by_its_final_path(disk):
    final = disk / "checkpoints" / "step_0000002"
    with atomic_dir(final) as tmp:
        atomic_write_json(tmp / "meta.json", {"step": 2})
    fill(disk, leave=64 << 10)
    for name, write in [("optimizer.pt", lambda p: _in(writing(p, "wb"), _torch)),
                        ("model.safetensors", lambda p: save_file({"w": torch.ones(200_000)}, str(p))),
                        ("meta.json", lambda p: atomic_write_json(p, list(range(100_000))))]:
        with pytest.raises(DiskFullError) as e:
            with atomic_dir(final) as tmp:
                write(tmp / name)
        # safetensors writes by itself and does not say which file: the directory is named
        named = final if name == "model.safetensors" else final / name
        assert str(e.value).startswith(f"disk full writing {named}: {NO_SPACE}")
        assert json.loads((final / "meta.json").read_text()) == {"step": 2} and leftovers(disk) == []


def _in(context, write):
    with context as f:
        write(f)


def test_an_appended_log_names_its_file(disk):
    path = disk / "metrics.jsonl"
    f = open_named(path, "a", encoding="utf-8")
    fill(disk)
    with pytest.raises(DiskFullError) as e:
        f.write("x" * 100_000)
        f.flush()
    assert str(e.value).startswith(f"disk full writing {path}: {NO_SPACE}")
    with contextlib.suppress(DiskFullError):
        f.close()


def test_the_cli_turns_any_full_disk_into_one_line(monkeypatch, capsys):
    """A writer outside io.py that meets a full disk still ends in one line (naming the file where the error
    does), never a traceback."""
    import groundup.corpus.commands as sample

    for error, shown in [(OSError(errno.ENOSPC, NO_SPACE), "error: disk full: "),
                         (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/data/x.bin"),
                          f"error: disk full writing /data/x.bin: {os.strerror(errno.EDQUOT)}"),
                         (RuntimeError("I/O error: No space left on device (os error 28)"), "error: disk full: ")]:
        def sample_raising(args, error=error):
            raise error

        monkeypatch.setattr(sample, "sample", sample_raising)
        assert main(["data", "sample", "--out", "x"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(shown) and err.count("\n") == 1 and "Traceback" not in err, err


# --- the verbs, end to end ---------------------------------------------------------------------------------------

def test_train_on_a_full_disk_keeps_its_last_checkpoint_and_resumes_once_there_is_space(disk, tmp_path_factory):
    shards, _ = shared_shards(tmp_path_factory)
    run = disk / "run"
    run_cli("train", "--out", str(run), f"data.shards={json.dumps(str(shards))}", *TINY, "checkpoint.every=2",
            "train.max_steps=2", "--quiet")
    before = {p.name: p.read_bytes() for p in (run / "checkpoints" / "step_0000002").iterdir()}
    filler = fill(disk, leave=256 << 10)  # room for the log lines, not for a checkpoint
    failed = run_cli("train", "--resume", str(run), "train.max_steps=4", "--quiet", check=False)
    one_error_line(failed, run / "checkpoints" / "step_0000004" / "model.safetensors")
    assert read_latest(run) == "step_0000002" and leftovers(run) == []
    assert {p.name: p.read_bytes() for p in (run / "checkpoints" / "step_0000002").iterdir()} == before
    filler.unlink()
    run_cli("train", "--resume", str(run), "train.max_steps=4", "--quiet")
    assert read_latest(run) == "step_0000004"


def test_data_sample_and_tokenize_on_a_full_disk(disk, tmp_path_factory):
    _, tokenizer = shared_shards(tmp_path_factory)
    out = disk / "sample"
    run_cli("data", "sample", "--out", str(out), "--domains", "code", "--limit", "40")
    kept = (out / "python-stdlib.jsonl").read_bytes()
    filler = fill(disk, leave=64 << 10)
    failed = run_cli("data", "sample", "--out", str(out), "--domains", "code", "--limit", "40", "--overwrite",
                     check=False)
    one_error_line(failed, out / "python-stdlib.jsonl")
    assert (out / "python-stdlib.jsonl").read_bytes() == kept and leftovers(disk) == []

    filler.unlink()
    fill(disk, leave=64 << 10)  # less than the shards need
    shards = disk / "shards"
    failed = run_cli("data", "tokenize", "--tokenizer", str(tokenizer), "--input", str(out / "python-stdlib.jsonl"),
                     "--out", str(shards), "--workers", "1", "--quiet", check=False)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    line = failed.stderr.strip()
    assert line.startswith(f"error: disk full writing {shards}/") and f": {NO_SPACE}" in line and "\n" not in line
    assert not (shards / "index.json").exists() and leftovers(disk) == []


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    yield from one_process_fsdp(tmp_path_factory)


@pytest.mark.parametrize("async_save", [False, True])
def test_a_sharded_checkpoint_on_a_full_disk_names_the_step_and_keeps_the_last_one(disk, sharded, monkeypatch,
                                                                                     async_save):
    """DCP's own writer meets the full disk (its error holds each process's failure and traceback)."""
    from groundup.errors import CheckpointError
    from groundup.train import dcp, loop, train
    from train_helpers import tiny_config

    shards, make_dist = sharded
    start_save = dcp.start_save

    def filling(d, model, optimizers, run_dir, step, *args):
        if step == 4:
            fill(disk, leave=16 << 10)
        return start_save(d, model, optimizers, run_dir, step, *args)

    monkeypatch.setattr(dcp, "start_save", filling)
    monkeypatch.setattr(loop, "init_distributed", lambda _cfg, _model_cfg=None: make_dist())
    run = disk / "run"
    cfg = tiny_config(shards, "train.max_steps=6", "checkpoint.every=2", "eval.at_end=false",
                      "distributed.strategy=fsdp", "train.device=cpu",
                      f"checkpoint.async_save={str(async_save).lower()}")
    with pytest.raises(CheckpointError) as e:
        train(cfg, run)
    message = str(e.value)
    assert message.startswith(f"disk full writing {run / 'checkpoints' / 'step_0000004'}") and "\n" not in message
    assert f": {NO_SPACE}" in message and "--resume" in message
    assert read_latest(run) == "step_0000002" and leftovers(run) == []
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_0000002"]
