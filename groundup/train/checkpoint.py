"""Checkpoints: written whole or not at all, verified on resume, rotated.

    RUN/checkpoints/step_0001000/
        model.safetensors  model.toml    a model directory: groundup.model.io.load_model(it) works
        optimizer.pt                     optimizer state keyed by parameter name (any layout loads it)
        loader.pt                        each process's data-loader position
        trainer.pt                       step, schedule, spike-guard history, RNG states, counters
        meta.json                        step, config, world size, metrics.jsonl offset, checksums
    RUN/checkpoints/latest               the newest complete step directory's name, written last

Everything loads without running code: safetensors, TOML, JSON and `torch.load(weights_only=True)`.
A step directory is built under a temporary name and renamed into place, then the pointer is
replaced; a kill at any moment leaves the previous checkpoint and pointer intact. `meta.json`
holds an xxh3-128 digest of every file (fast enough for multi-GB files), so a truncated or
corrupted checkpoint is found at resume and the previous complete one is used instead.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import torch
import xxhash

from groundup.config import config_to_dict
from groundup.errors import CheckpointError
from groundup.io import atomic_dir, atomic_write_json, atomic_write_text, read_json
from groundup.model.io import LATEST_POINTER, build_from_state, save_model

FORMAT = "groundup-checkpoint"
STEP_DIR = re.compile(r"^step_(\d{7,})$")
META_FILE = "meta.json"


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def file_digest(path: Path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _save_pt(obj, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(run_dir: Path, step: int, cfg, model_state: dict, optimizer_state: dict,
                    loader_states: list[dict], trainer_state: dict, meta: dict) -> Path:
    """Write step `step`'s checkpoint (main process only) and point `latest` at it."""
    ckpt_dir = run_dir / "checkpoints"
    final = ckpt_dir / step_name(step)
    with atomic_dir(final) as tmp:
        save_model(build_from_state(cfg.model, model_state), tmp)
        _save_pt(optimizer_state, tmp / "optimizer.pt")
        _save_pt({"ranks": loader_states}, tmp / "loader.pt")
        _save_pt(trainer_state, tmp / "trainer.pt")
        files = {p.name: file_digest(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        atomic_write_json(tmp / META_FILE, {"format": FORMAT, "version": 1, "step": step,
                                            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                            "config": config_to_dict(cfg), **meta, "files": files})
    atomic_write_text(ckpt_dir / LATEST_POINTER, final.name + "\n")  # last: vouches for a complete dir
    return final


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every step directory, newest first (complete or not)."""
    ckpt_dir = run_dir / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def problem(step_dir: Path) -> str | None:
    """Why `step_dir` is not a complete, intact checkpoint (None when it is)."""
    meta_path = step_dir / META_FILE
    if not meta_path.is_file():
        return f"no {META_FILE} (the write did not finish)"
    try:
        meta = read_json(meta_path)
    except Exception as e:  # noqa: BLE001 - any unreadable meta means the same thing here
        return f"unreadable {META_FILE}: {e}"
    if meta.get("format") != FORMAT or not isinstance(meta.get("files"), dict):
        return f"{META_FILE} is not a groundup checkpoint's"
    for name, digest in meta["files"].items():
        path = step_dir / name
        if not path.is_file():
            return f"{name} is missing"
        if file_digest(path) != digest:
            return f"{name} does not match its checksum (truncated or corrupt)"
    return None


def find_resumable(run_dir: Path, note=print) -> Path | None:
    """The newest intact checkpoint: the one `latest` names, else the newest older one that checks out."""
    pointer = run_dir / "checkpoints" / LATEST_POINTER
    named = pointer.read_text().strip() if pointer.is_file() else None
    candidates = list_checkpoints(run_dir)
    if named:  # the pointer's target first; anything newer was never vouched for
        named_step = next((s for s, p in candidates if p.name == named), None)
        if named_step is None:
            note(f"warning: {pointer} names {named}, which does not exist")
        else:
            candidates = [(s, p) for s, p in candidates if s <= named_step]
    for step, path in candidates:
        why = problem(path)
        if why is None:
            return path
        note(f"warning: checkpoint {path.name} is unusable ({why}); trying the previous one")
    return None


def load_checkpoint(step_dir: Path) -> dict:
    """Everything a checkpoint holds, loaded without running code from it."""
    from groundup.model.io import WEIGHTS_FILE, load_state

    def pt(name: str):
        try:
            return torch.load(step_dir / name, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - name the file, whatever torch raised
            raise CheckpointError(f"{step_dir / name}: cannot load ({e})") from None

    return {"meta": read_json(step_dir / META_FILE), "model": load_state(step_dir / WEIGHTS_FILE),
            "optimizer": pt("optimizer.pt"), "loader": pt("loader.pt")["ranks"], "trainer": pt("trainer.pt")}


def rotate(run_dir: Path, every: int, keep_last: int, keep_every: int) -> list[str]:
    """Delete checkpoints beyond the last `keep_last`, except every `keep_every`-th; returns names removed."""
    pointer = run_dir / "checkpoints" / LATEST_POINTER
    current = pointer.read_text().strip() if pointer.is_file() else None
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
