"""`train(cfg, out_dir, resume=False)`: pretraining, the next-token objective on token shards.

    from groundup.train import TrainConfig, train
    cfg = load_config(TrainConfig, "configs/train-tiny.toml", ["data.shards=out/tokens", "train.max_steps=50"])
    summary = train(cfg, "runs/tiny")                  # fresh: refuses a directory that holds a run
    summary = train(cfg, "runs/tiny", resume=True)     # continue from the newest intact checkpoint

Everything specific to pretraining is here and in run.py (the shards and their tokenizer); the run
session, the loop, the step and checkpoints are the shared training core.
"""

from __future__ import annotations

from pathlib import Path

from groundup.tokens.loader import TokenLoader
from groundup.train.config import TrainConfig
from groundup.train.objective import NextTokenObjective
from groundup.train.session import open_run


def train(cfg: TrainConfig, out_dir: str | Path, resume: bool = False) -> dict:
    """Train per `cfg` into `out_dir`; returns the summary (also written to RUN/summary.json)."""
    with open_run(cfg, out_dir, resume) as run:
        cfg, d = run.cfg, run.dist
        loader = TokenLoader(cfg.data.shards, "train", cfg.train.seq_len, cfg.train.batch_size, rank=d.rank,
                             world_size=d.world_size, seed=cfg.train.seed, domain_weights=cfg.data.domain_weights,
                             bos_aligned=cfg.data.bos_aligned, expected_tokenizer_hash=run.tokenizer.hash)
        return run.train(NextTokenObjective(cfg), loader)
