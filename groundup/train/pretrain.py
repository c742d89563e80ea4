"""`train(cfg, out_dir, resume=False)`: pretraining, the next-token objective on token shards.

    from groundup.train import TrainConfig, train
    cfg = load_config(TrainConfig, "configs/train-tiny.toml", ["data.shards=out/tokens", "train.max_steps=50"])
    summary = train(cfg, "runs/tiny")                  # fresh: refuses a directory that holds a run
    summary = train(cfg, "runs/tiny", resume=True)     # continue from the newest intact checkpoint

Everything specific to pretraining is here and in run.py (the shards, their tokenizer, the run
directory's first files); the loop, the step and checkpoints are the shared training core.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from groundup.io import writer_lock
from groundup.layout import LOCK_FILE
from groundup.tokens.loader import TokenLoader
from groundup.train.config import TrainConfig
from groundup.train.loop import run, training_session
from groundup.train.metrics import check_trackers
from groundup.train.objective import NextTokenObjective
from groundup.train.run import prepare, write_run_files
from groundup.train.state import build_state


def train(cfg: TrainConfig, out_dir: str | Path, resume: bool = False) -> dict:
    """Train per `cfg` into `out_dir`; returns the summary (also written to RUN/summary.json)."""
    began = time.time()
    out = Path(out_dir)
    check_trackers(cfg.log.tensorboard, cfg.log.wandb)  # refused before the run directory is created
    with training_session(cfg) as (d, stop), writer_lock(out, LOCK_FILE, create=not resume) if d.is_main \
            else contextlib.nullcontext():
        cfg, tok, changes, tok_dir = prepare(cfg, out, resume, d.is_main)
        d.barrier()  # every process has checked the directory before the main one writes into it
        if d.is_main:
            write_run_files(cfg, out, tok_dir, resume, changes)
        d.barrier()
        loader = TokenLoader(cfg.data.shards, "train", cfg.train.seq_len, cfg.train.batch_size, rank=d.rank,
                             world_size=d.world_size, seed=cfg.train.seed, domain_weights=cfg.data.domain_weights,
                             bos_aligned=cfg.data.bos_aligned, expected_tokenizer_hash=tok.hash)
        state = build_state(cfg, d, NextTokenObjective(cfg), loader, tokenizer=tok, run_dir=out)
        return run(state, resume=resume, changes=changes, stop=stop, began=began)
