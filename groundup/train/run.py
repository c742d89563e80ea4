"""The run directory before the first step: which tokenizer, which config, fresh or resumed.

    RUN/config.toml       the fully resolved TrainConfig (rewritten when a resume changes allowed keys)
    RUN/tokenizer/        a copy of the tokenizer the shards were made with: the run is self-contained
    RUN/metrics.jsonl     see metrics.py
    RUN/checkpoints/      see checkpoint.py
    RUN/summary.json      what `train()` returned, written at the end

Everything here runs before any model is built, so a wrong path, a shard directory made with
another tokenizer, a run directory that already holds a run, or a resume with an incompatible
config fails in a second with a message, and never overwrites finished work.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from groundup.config import load_config, save_config
from groundup.tokens.shards import check_tokenizer, read_index
from groundup.errors import CheckpointError, ConfigError, DataError
from groundup.io import atomic_dir, ensure_writable_dir
from groundup.layout import RUN_CONFIG_FILE as CONFIG_FILE, TOKENIZER_DIR, is_run_dir, is_tokenizer_dir
from groundup.tokenizer import Tokenizer, load_tokenizer
from groundup.train.metrics import check_trackers
from groundup.train.config import TrainConfig, check_compatible, resume_differences


def _data_tokenizer_dir(cfg: TrainConfig, index: dict) -> Path:
    """The tokenizer directory: data.tokenizer, else the one recorded in the shards' index."""
    if cfg.data.tokenizer:
        return Path(cfg.data.tokenizer)
    named = index.get("tokenizer")
    shards = Path(cfg.data.shards)
    for candidate in ([Path(named), shards / named] if named else []):
        if is_tokenizer_dir(candidate):
            return candidate
    raise ConfigError(f"data.tokenizer is not set and the tokenizer recorded in {shards}/index.json "
                      f"({named!r}) is not found: set data.tokenizer to the tokenizer directory", key="data.tokenizer")


def _match_vocab(cfg: TrainConfig, tok: Tokenizer) -> TrainConfig:
    if cfg.data.match_vocab:
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=tok.vocab_size))
    if cfg.model.vocab_size < tok.vocab_size:
        raise ConfigError(f"model.vocab_size = {cfg.model.vocab_size}: expected at least the tokenizer's "
                          f"{tok.vocab_size} (or data.match_vocab = true)", key="model.vocab_size")
    return cfg


def prepare(cfg: TrainConfig, out: Path, resume: bool, is_main: bool) -> tuple[TrainConfig, Tokenizer, list[str], Path]:
    """Check everything about the run directory and data, writing nothing but the empty directory.

    Returns (resolved config, tokenizer, changes, tokenizer directory); `changes` lists the allowed
    config differences of a resume. Every process checks before any writes (see `write_run_files`),
    so no process mistakes the main one's fresh config.toml for an earlier run.
    """
    check_trackers(cfg.log.tensorboard, cfg.log.wandb)
    if not cfg.data.shards:
        raise ConfigError("data.shards is not set: point it at a directory from 'groundup data tokenize'",
                          key="data.shards")
    index = read_index(cfg.data.shards)  # DataError when missing or not shards
    changes: list[str] = []
    if resume:
        if not (out / CONFIG_FILE).is_file():
            raise CheckpointError(f"{out}: no {CONFIG_FILE}, so not a training run directory to resume")
        tok_dir = out / TOKENIZER_DIR
        tok = load_tokenizer(tok_dir)
        cfg = _match_vocab(cfg, tok)
        saved = load_config(TrainConfig, out / CONFIG_FILE)
        check_compatible(saved, cfg, f"{out / CONFIG_FILE}")
        changes = resume_differences(saved, cfg)[1]
    else:
        if is_run_dir(out):
            raise DataError(f"{out} already holds a training run: resume it with 'groundup train --resume {out}' "
                            "or choose another --out")
        if is_main:
            ensure_writable_dir(out)
        tok_dir = _data_tokenizer_dir(cfg, index)
        tok = load_tokenizer(tok_dir)
        cfg = _match_vocab(cfg, tok)
    check_tokenizer(index, tok.hash, cfg.data.shards)
    return cfg, tok, changes, tok_dir


def write_run_files(cfg: TrainConfig, out: Path, tok_dir: Path, resume: bool, changes: list[str]) -> None:
    """The main process's writes before training: the tokenizer copy and the resolved config."""
    if not resume:
        with atomic_dir(out / TOKENIZER_DIR) as tmp:
            shutil.copytree(tok_dir, tmp, dirs_exist_ok=True)
    if not resume or changes:
        save_config(cfg, out / CONFIG_FILE)
