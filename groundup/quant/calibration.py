"""Calibration tokens for GPTQ: the first N tokens of the text records a user gives.

Records are read with `groundup.data.iter_records` (JSONL, Parquet, plain text), each encoded
after the end-of-text id (the context every training document starts in, as token shards have
it), concatenated, cut at `n_tokens` and split into rows of `seq_len`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from groundup.config import ConfigError
from groundup.errors import DataError

DEFAULT_TOKENS = 16384
MIN_TOKENS = 512
DEFAULT_SEQ_LEN = 512


def calibration_rows(paths: Sequence[str | Path], tokenizer, n_tokens: int = DEFAULT_TOKENS,
                     seq_len: int = DEFAULT_SEQ_LEN, min_tokens: int = MIN_TOKENS) -> list[list[int]]:
    """Rows of at most `seq_len` token ids, `n_tokens` in all; DataError when the text has fewer
    than `min_tokens`."""
    from groundup.data import iter_records

    if n_tokens < min_tokens:
        raise ConfigError(f"--calibration-tokens {n_tokens}: GPTQ needs at least {min_tokens} calibration tokens",
                          key="calibration_tokens")
    if seq_len < 1:
        raise ConfigError(f"--seq-len {seq_len}: expected a positive length", key="seq_len")
    prefix = [] if getattr(tokenizer, "eot_id", None) is None else [tokenizer.eot_id]
    stream: list[int] = []
    records = iter_records([str(p) for p in paths])
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
        names = ", ".join(str(p) for p in paths)
        raise DataError(f"calibration text too short: {names} gave {len(stream)} tokens, and GPTQ needs at least "
                        f"{min_tokens}; give more text (--calibration FILES)")
    return [stream[i : i + seq_len] for i in range(0, len(stream), seq_len)]
