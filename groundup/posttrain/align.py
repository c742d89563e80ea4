"""`dpo(cfg, out)` and `kto(cfg, out)`: preference optimisation on the shared training core.

    cfg = load_config(DPOConfig, None, ["base=runs/sft", 'dpo.data=["pairs.jsonl"]', "dpo.beta=0.1"])
    summary = dpo(cfg, "runs/dpo")

Before the first step the reference log-likelihoods of every training and held-out example are
computed with the model as it starts (under LoRA the adapter is still zero, so the reference is the
base and no second copy exists) and cached in RUN/reference_logps.safetensors, which a resume reads
back (or recomputes from the base, should the file be gone). Logged per step: loss, rewards of the
chosen and rejected completions, their margin and the pairs ranked right (DPO); loss, the KL reference
point and rewards (KTO); at each evaluation the same on the held-out split.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from groundup.errors import DataError
from groundup.io import atomic_write_json, follow_umask
from groundup.layout import DATA_REPORT_FILE, REFERENCE_LOGPS_FILE
from groundup.posttrain.config import DPOConfig, KTOConfig
from groundup.posttrain.pairs import read_feedback, read_pairs, split_heldout
from groundup.posttrain.records import no_usable_held_out
from groundup.posttrain.preference import PreferenceLoader, PreferenceObjective, reference_logps
from groundup.train.session import open_run


def _fingerprint(items: list, kind: str) -> str:
    """A digest of the tokenized data, so a cached reference never outlives the data it was computed on."""
    h = hashlib.sha256(kind.encode())
    for x in items:
        parts = (x.prompt, x.chosen, x.rejected) if kind == "dpo" else (x.prompt, x.completion)
        for p in parts:
            h.update(b"|" + ",".join(map(str, p)).encode())
    return h.hexdigest()[:16]


def _references(model, train: list, held: list, kind: str, pad: int, out: Path, is_main: bool, batch: int,
                note) -> tuple[torch.Tensor, torch.Tensor]:
    path = out / REFERENCE_LOGPS_FILE
    key = _fingerprint(train, kind) + _fingerprint(held, kind)
    if path.is_file():
        try:
            with safe_open(str(path), "pt") as f:
                if (f.metadata() or {}).get("data") == key:
                    return f.get_tensor("train"), f.get_tensor("heldout")
            note(f"note: {path} was computed on other data; computing the reference again")
        except (SafetensorError, OSError, KeyError) as e:
            note(f"note: {path} is unreadable ({e}); computing the reference again")
    note(f"computing the reference log-likelihoods of {len(train) + len(held):,} examples once")
    ref_train = reference_logps(model, train, kind, pad, "cpu", batch, chunk=batch)
    ref_held = reference_logps(model, held, kind, pad, "cpu", batch, chunk=batch) if held else torch.zeros(0, 2)
    if is_main:
        save_file({"train": ref_train, "heldout": ref_held}, str(path), metadata={"data": key})
        follow_umask(path)
    return ref_train, ref_held


def _align(cfg, out_dir: str | Path, resume: bool, kind: str) -> dict:
    with open_run(cfg, out_dir, resume, base=cfg.base) as run:
        cfg, d, tok, note = run.cfg, run.dist, run.tokenizer, run.note
        section = cfg.dpo if kind == "dpo" else cfg.kto
        if not section.data:
            raise DataError(f"no {kind} data: pass --data FILE... (JSONL or Parquet)")
        read = read_pairs if kind == "dpo" else read_feedback
        items, report = read(section.data, tok, cfg.train.seq_len + 1)
        if section.eval_data:
            held, held_report = read(section.eval_data, tok, cfg.train.seq_len + 1)
            if not held:  # never "no held-out data" for files the user named
                raise no_usable_held_out("--eval-data", section.eval_data, f"{kind} record",
                                         f"{held_report.records:,} read", held_report.skipped[:2])
            report.skipped += held_report.skipped
            train = items
        else:
            train, held = split_heldout(items, section.val_fraction, section.seed)
        for i, x in enumerate(train):
            x.index = i
        for i, x in enumerate(held):
            x.index = i
        if report.skipped:
            note(f"skipped {len(report.skipped):,} of {report.records:,} records: " + "; ".join(report.skipped[:3]))
        pad = tok.pad_id if tok.pad_id is not None else tok.eot_id
        loader = PreferenceLoader(train, kind, cfg.train.batch_size, pad, seed=section.seed, rank=d.rank,
                                  world_size=d.world_size)
        run.steps_from_epochs(section.epochs, len(train), cfg.train.batch_size)
        run.commit()  # a resume is checked before the reference log-likelihoods are computed
        cfg = run.cfg
        note(f"{len(train):,} {kind} examples ({len(held):,} held out), {report.truncated_prompts:,} prompts cut "
             f"from the start to fit, {cfg.train.max_steps:,} steps")
        ref_train, ref_held = _references(run.model, train, held, kind, pad, run.out, d.is_main, cfg.train.batch_size,
                                          note)
        if d.is_main and not resume:
            atomic_write_json(run.out / DATA_REPORT_FILE, {**report.to_dict(), "train": len(train), "heldout": len(held)})
        return run.train(PreferenceObjective(kind, section, ref_train, held, ref_held, pad), loader)


def dpo(cfg: DPOConfig, out_dir: str | Path, resume: bool = False) -> dict:
    """Direct preference optimisation of `cfg.base` on `cfg.dpo.data` pairs; returns the summary."""
    return _align(cfg, out_dir, resume, "dpo")


def kto(cfg: KTOConfig, out_dir: str | Path, resume: bool = False) -> dict:
    """Kahneman-Tversky optimisation of `cfg.base` on `cfg.kto.data` (prompt, completion, label) records."""
    return _align(cfg, out_dir, resume, "kto")
