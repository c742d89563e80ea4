"""Calibration tokens for GPTQ: the first N tokens of the text records a user gives, or, when none
are given, of a slice of the embedded corpus (Shakespeare, standard-library code and arithmetic
interleaved record by record, so every domain is in the first tokens).

Records are read with `groundup.data.iter_records` (JSONL, Parquet, plain text), each encoded
after the end-of-text id (the context every training document starts in, as token shards have
it), concatenated, cut at `n_tokens` and split into rows of `seq_len`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from groundup.config import ConfigError
from groundup.corpus import iter_corpus
from groundup.data import iter_records
from groundup.errors import DataError

DEFAULT_TOKENS = 16384
MIN_TOKENS = 512
DEFAULT_SEQ_LEN = 512


EMBEDDED = "the embedded corpus"


def embedded_records() -> Iterator[dict]:
    """The embedded corpus' domains interleaved, one record (a chunk of 2,000 characters) of each in turn."""

    streams = [iter_corpus([domain], chunk_chars=2000, math_count=2000) for domain in ("text", "code", "math")]
    while streams:
        for stream in list(streams):
            record = next(stream, None)
            if record is None:
                streams.remove(stream)
            else:
                yield record


def calibration_rows(paths: Sequence[str | Path] | None, tokenizer, n_tokens: int = DEFAULT_TOKENS,
                     seq_len: int = DEFAULT_SEQ_LEN, min_tokens: int = MIN_TOKENS) -> list[list[int]]:
    """Rows of at most `seq_len` token ids, `n_tokens` in all (no `paths`: the embedded corpus);
    DataError when the text has fewer than `min_tokens`."""

    if n_tokens < min_tokens:
        raise ConfigError(f"--calibration-tokens {n_tokens}: GPTQ needs at least {min_tokens} calibration tokens",
                          key="calibration_tokens")
    if seq_len < 1:
        raise ConfigError(f"--seq-len {seq_len}: expected a positive length", key="seq_len")
    prefix = [] if getattr(tokenizer, "eot_id", None) is None else [tokenizer.eot_id]
    stream: list[int] = []
    records = iter_records([str(p) for p in paths]) if paths else embedded_records()
    try:
        for record in records:
            text = record.get("text")
            if not isinstance(text, str) or not text:
                continue
            stream += prefix + tokenizer.encode(text)
            if len(stream) >= n_tokens:
                break
    finally:
        records.close()
    stream = stream[:n_tokens]
    if len(stream) < min_tokens:
        names = ", ".join(str(p) for p in paths) if paths else EMBEDDED
        raise DataError(f"calibration text too short: {names} gave {len(stream)} tokens, and GPTQ needs at least "
                        f"{min_tokens}; give more text (--calibration FILES)")
    return [stream[i : i + seq_len] for i in range(0, len(stream), seq_len)]
