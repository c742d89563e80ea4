"""Checkpoints: written whole or not at all, verified on resume, rotated.

    RUN/checkpoints/step_0001000/
        model.safetensors  model.toml    a model directory: groundup.quant.load.load_model(it) works
        optimizer.pt                     optimizer state keyed by parameter name (any layout loads it)
        loader.pt                        each process's data-loader position
        trainer.pt                       step, schedule, spike-guard history, RNG states, counters
        meta.json                        step, config, world size, metrics.jsonl offset, checksums
    RUN/checkpoints/latest               the newest complete step directory's name, written last

FSDP2 and tensor-parallel runs write their optimizer and model state as per-process shards through
torch.distributed.checkpoint beside the same files (dcp.py describes that layout); the model
directory is still there, consolidated from the shards, so every reader works unchanged.

Everything loads without running code: safetensors, TOML, JSON and `torch.load(weights_only=True)`.
A step directory is built under a temporary name and renamed into place, then the pointer is
replaced; a kill at any moment leaves the previous checkpoint and pointer intact. `meta.json`
holds an xxh3-128 digest of every file (fast enough for multi-GB files), so a truncated or
corrupted checkpoint is found at resume and the previous complete one is used instead.
"""

from __future__ import annotations

import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from groundup.config import config_to_dict
from groundup.errors import CheckpointError
from groundup.io import atomic_dir, atomic_write_json, atomic_write_text, writing
from groundup.layout import (ADAPTER_WEIGHTS_FILE, CHECKPOINT_FORMAT, CHECKPOINT_META_FILE, WEIGHTS_FILE,
                             checkpoints_dir, file_digest, latest_pointer, list_checkpoints, read_checkpoint_meta,
                             read_latest, step_name)
from groundup.model.model_dir import build_from_state, load_state, save_model

GROUPS_FILE = "optimizer_groups.pt"  # sharded checkpoints: the optimizer's param groups (dcp.py)


def _save_pt(obj, path: Path) -> None:
    with writing(path, "wb") as f:  # a full disk names the file (torch's own error would not)
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(run_dir: Path, step: int, cfg, model_cfg, model_state: dict | Callable[[Path], None], optimizer_state: dict,
                    loader_states: list[dict], trainer_state: dict, meta: dict) -> Path:
    """Write step `step`'s checkpoint (main process only) and point `latest` at it.

    `model_state`: the full model's tensors (a model directory is written), or a function that writes
    the model's files into the directory it is given (a LoRA run writes its adapter)."""
    final = checkpoints_dir(run_dir) / step_name(step)
    with atomic_dir(final) as tmp:
        if callable(model_state):
            model_state(tmp)
        else:
            save_model(build_from_state(model_cfg, model_state), tmp)
        _save_pt(optimizer_state, tmp / "optimizer.pt")
        _save_pt({"ranks": loader_states}, tmp / "loader.pt")
        _save_pt(trainer_state, tmp / "trainer.pt")
        _seal(tmp, step, cfg, meta)
    atomic_write_text(latest_pointer(run_dir), final.name + "\n")  # last: vouches for a complete dir
    return final


def finish_sharded(tmp: Path, step: int, cfg, model_cfg, model_state: dict, optimizer_groups: dict, loader_states: list[dict],
                   trainer_state: dict, meta: dict, digests: dict[str, str]) -> None:
    """The main process's part of a sharded checkpoint, once every process's shards are in `tmp`:
    the consolidated model directory, the small files, and meta.json (the caller renames and points)."""
    save_model(build_from_state(model_cfg, model_state), tmp)
    _save_pt(optimizer_groups, tmp / GROUPS_FILE)
    _save_pt({"ranks": loader_states}, tmp / "loader.pt")
    _save_pt(trainer_state, tmp / "trainer.pt")
    _seal(tmp, step, cfg, meta, digests)


def _seal(tmp: Path, step: int, cfg, meta: dict, digests: dict[str, str] | None = None) -> None:
    """meta.json with every file's digest (`digests`: those each process computed for its own shards)."""
    digests = digests or {}
    files = {p.name: digests.get(p.name) or file_digest(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    atomic_write_json(tmp / CHECKPOINT_META_FILE, {"format": CHECKPOINT_FORMAT, "version": 1, "step": step,
                                                   "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                   "config": config_to_dict(cfg), **meta, "files": files})


def load_plain_pickle(path: Path):
    """`torch.load(weights_only=True)`: tensors and plain values only, so loading can never run code.

    A file that holds anything else is refused, and the message says why instead of passing on
    torch's advice to retry with weights_only=False (exactly what must not be done with a file
    someone else made)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path}: refused: it holds Python objects that unpickling would execute, and "
                              "groundup only loads tensors and plain values (a checkpoint groundup wrote never holds "
                              "anything else; this file was altered or made elsewhere)") from None
    except Exception as e:  # noqa: BLE001 - name the file, whatever torch raised
        raise CheckpointError(f"{path}: cannot load ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def load_checkpoint(step_dir: Path) -> dict:
    """Everything a checkpoint holds, loaded without running code from it.

    A sharded checkpoint's model and optimizer state stay on disk ("sharded": True): restore_state
    reads the shards this process needs (dcp.restore)."""
    def pt(name: str):
        return load_plain_pickle(step_dir / name)

    meta = read_checkpoint_meta(step_dir)
    common = {"meta": meta, "dir": step_dir, "loader": pt("loader.pt")["ranks"], "trainer": pt("trainer.pt")}
    if "sharded" in meta:
        return {**common, "sharded": True, "model": None, "optimizer": None}
    model = load_state(step_dir / WEIGHTS_FILE) if (step_dir / WEIGHTS_FILE).is_file() else None
    if model is None and not (step_dir / ADAPTER_WEIGHTS_FILE).is_file():
        raise CheckpointError(f"{step_dir}: neither {WEIGHTS_FILE} nor {ADAPTER_WEIGHTS_FILE}")
    return {**common, "model": model, "optimizer": pt("optimizer.pt")}


def rotate(run_dir: Path, every: int, keep_last: int, keep_every: int) -> list[str]:
    """Delete checkpoints beyond the last `keep_last`, except every `keep_every`-th; returns names removed."""
    current = read_latest(run_dir)
    removed = []
    for i, (step, path) in enumerate(list_checkpoints(run_dir)):
        permanent = keep_every and step % (every * keep_every) == 0
        if i < keep_last or permanent or path.name == current:
            continue
        trash = path.with_name(f".trash-{path.name}")
        os.replace(path, trash)  # renamed first, so a half-deleted directory never looks like a checkpoint
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(path.name)
    return removed


def restore_loader(loader, saved: list[dict], note=print) -> None:
    """Put this process's loader where the saved run left off.

    Same world size and batch size: exact. Otherwise (an FSDP checkpoint resumed by one process, the
    reverse, or the global batch split differently): within each domain's current epoch, continue after the furthest window any process
    took. Process r of W took windows r, r+W, ..., so the new process r' of W' starts at its first
    window at or past that point; with the same global batch this is exactly the data an
    uninterrupted run would have read next (single-domain data; with several domains the domain
    draws differ).
    """
    mine = loader.state_dict()
    if len(saved) == loader.world_size and saved[loader.rank].get("batch_size") == loader.batch_size:
        loader.load_state_dict(saved[loader.rank])
        return
    keep = ("split", "seq_len", "seed", "bos_aligned", "weights", "tokenizer_hash", "tokens", "version")
    differ = [k for k in keep if saved[0].get(k) != mine.get(k)]
    if differ:
        raise CheckpointError(f"cannot resume the data loader: {', '.join(differ)} differ from the checkpoint's")
    old_world = len(saved)
    cursors = {}
    for domain in mine["cursors"]:
        epoch = max(s["cursors"][domain][0] for s in saved)
        furthest = max(((s["rank"] + (s["cursors"][domain][1] - 1) * old_world) for s in saved
                        if s["cursors"][domain][0] == epoch and s["cursors"][domain][1] > 0), default=-1)
        next_window = furthest + 1
        position = max(0, -(-(next_window - loader.rank) // loader.world_size))  # ceil division
        cursors[domain] = [epoch, position]
    loader.load_state_dict({**mine, "batch": max(s["batch"] for s in saved), "cursors": cursors})
    note(f"note: the checkpoint was written by {old_world} process(es) of {saved[0]['batch_size']} sequences, this "
         f"run has {loader.world_size} of {loader.batch_size}: the data loader continues after the furthest window "
         "any process read")
