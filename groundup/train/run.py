"""Pretraining's start: the token shards, the tokenizer they were made with, the vocabulary.

    RUN/config.toml       the fully resolved TrainConfig (rewritten when a resume changes allowed keys)
    RUN/tokenizer/        a copy of the tokenizer the shards were made with: the run is self-contained
    RUN/metrics.jsonl     see metrics.py
    RUN/checkpoints/      see checkpoint.py
    RUN/summary.json      what `train()` returned, written at the end

Everything here runs before any model is built (session.open_run calls it), so a wrong path or a
shard directory made with another tokenizer fails in a second with a message.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from groundup.tokens.shards import check_tokenizer, read_index
from groundup.errors import ConfigError
from groundup.io import ensure_writable_dir
from groundup.layout import TOKENIZER_DIR, is_tokenizer_dir
from groundup.tokenizer import Tokenizer, load_tokenizer
from groundup.train.config import TrainConfig


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


def prepare_pretraining(cfg: TrainConfig, out: Path, resume: bool, is_main: bool) -> tuple[TrainConfig, Tokenizer,
                                                                                        Path | None]:
    """Pretraining's start, checked before anything is written: (config with the vocabulary matched,
    tokenizer, the tokenizer directory to copy into a fresh run or None on a resume).

    A fresh run takes the tokenizer the shards were made with (data.tokenizer, else the one their
    index.json names); a resumed run its own copy, RUN/tokenizer. Either must be the shards' tokenizer."""
    if not cfg.data.shards:
        raise ConfigError("data.shards is not set: point it at a directory from 'groundup data tokenize'",
                          key="data.shards")
    index = read_index(cfg.data.shards)  # DataError when missing or not shards
    if resume:
        tok_dir, copy_from = out / TOKENIZER_DIR, None
    else:
        if is_main:
            ensure_writable_dir(out)
        tok_dir = copy_from = _data_tokenizer_dir(cfg, index)
    tok = load_tokenizer(tok_dir)
    cfg = _match_vocab(cfg, tok)
    check_tokenizer(index, tok.hash, cfg.data.shards)
    return cfg, tok, copy_from
