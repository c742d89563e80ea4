"""Shared by the tokenizer, shard and loader tests: a small real corpus and one trained tokenizer.

Training is cached per test session (module-level), so the three test files pay for it once.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from groundup.corpus import chunk_text, generate_math_records, iter_shakespeare, iter_stdlib_code
from groundup.tokenizer import Tokenizer, TokenizerConfig, train_tokenizer

SMALL_VOCAB = 4096
_cache: dict[str, Path] = {}


def small_corpus() -> list[dict]:
    """About 1.5 MB: four Shakespeare works in 20K-character chunks, 120 stdlib files, 400 problems."""
    records = []
    for work in itertools.islice(iter_shakespeare(), 4):
        for i, chunk in enumerate(chunk_text(work["text"], 20_000)):
            records.append({**work, "id": f"{work['id']}#{i}", "text": chunk})
    records += list(itertools.islice(iter_stdlib_code(), 120))
    records += generate_math_records(400, seed=1)
    return records


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({k: r[k] for k in ("id", "source", "domain", "text")}, ensure_ascii=False) + "\n")
    return path


def trained_tokenizer_dir(tmp_path_factory) -> Path:
    """A tokenizer (vocab 4096) trained on `small_corpus`, saved once per session."""
    if "small" not in _cache:
        tok = train_tokenizer((r["text"] for r in small_corpus()), TokenizerConfig(vocab_size=SMALL_VOCAB),
                              progress=False)
        _cache["small"] = tok.save(tmp_path_factory.mktemp("tokenizer"))
    return _cache["small"]


def trained_tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.load(trained_tokenizer_dir(tmp_path_factory))


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    """The session's small tokenizer, as a fixture (test modules import it by name)."""
    return trained_tokenizer(tmp_path_factory)
