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


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus_text(n: int = 60_000) -> list[str]:
    return [w["text"][:n] for w in itertools.islice(iter_shakespeare(), 2)]


def byte_level_tokenizer(specials: list[str], vocab_size: int = 700):
    """A trained byte-level BPE (Llama 3's split regex) with `specials` after the learned vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer as RustTokenizer, decoders, models, pre_tokenizers, trainers

    tk = RustTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(corpus_text(), trainer)
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tk
