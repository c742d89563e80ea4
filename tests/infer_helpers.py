"""Shared by the inference and interop tests: a small tokenizer trained once, tiny model directories."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from conftest import tiny_config
from groundup.corpus import iter_shakespeare
from groundup.model import Transformer
from groundup.model.model_dir import save_model
from groundup.tokenizer import Tokenizer, TokenizerConfig, train_tokenizer

VOCAB = 512
_cache: dict[str, Tokenizer] = {}


def small_tokenizer() -> Tokenizer:
    """A 512-token BPE trained on 100 KB of Shakespeare (a fraction of a second), once per session."""
    if "tok" not in _cache:
        texts = [w["text"][:50_000] for w in itertools.islice(iter_shakespeare(), 2)]
        _cache["tok"] = train_tokenizer(texts, TokenizerConfig(vocab_size=VOCAB), progress=False)
    return _cache["tok"]


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    """The tiny preset (d_model 64, 2 layers) over the small tokenizer's vocabulary, in eval mode."""
    torch.manual_seed(seed)
    return Transformer(tiny_config(**{"vocab_size": VOCAB, **overrides})).eval()


def model_dir(path: Path, model: Transformer | None = None, tokenizer: Tokenizer | None = None) -> Path:
    """A model directory as `groundup train` and the demo leave it: weights, config, tokenizer/."""
    save_model(model if model is not None else tiny_model(), path)
    (tokenizer or small_tokenizer()).save(path / "tokenizer")
    return path
