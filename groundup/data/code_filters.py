"""Filters for source code and for math (URL block lists: data/web/url_lists.py).

Code is judged as code (The Stack / StarCoder rules: line lengths, alphanumeric fraction,
generated and minified files, byte entropy), never by prose rules, which would remove all of it.
Math is judged by its own rules: it is short, dense in digits and symbols, and fine that way.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from groundup.data.curate_config import CodeFilterConfig, MathFilterConfig

_NOT_ALNUM = re.compile(r"[\W_]+")
_DIGITS = re.compile(r"\d")
_SYMBOLS = re.compile(r"[^\w\s]|_")


def byte_entropy(data: bytes) -> float:
    """Shannon entropy in bits per byte: about 4.5-5 for source code, 8 for random data."""
    if not data:
        return 0.0
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    p = counts[counts > 0] / len(data)
    return float(-(p * np.log2(p)).sum())


def code(text: str, record: dict, cfg: CodeFilterConfig) -> str | None:
    # What the reader recognised from the path comes first: it needs no look at the content.
    if cfg.drop_vendored and record.get("vendored"):
        return "vendored"
    if cfg.drop_generated and record.get("generated"):
        return "generated_path"
    if cfg.drop_minified and record.get("minified"):
        return "minified_path"
    if len(text) < cfg.min_chars:
        return "too_short"
    lines = text.splitlines() or [""]
    longest = max(map(len, lines))
    if longest > cfg.max_line_length:
        return "long_line"
    if len(text) / len(lines) > cfg.max_mean_line_length:
        return "long_mean_line"
    alnum = len(text) - sum(len(run) for run in _NOT_ALNUM.findall(text))
    if alnum / len(text) < cfg.min_alnum_fraction:
        return "low_alnum_fraction"
    if cfg.drop_generated and cfg.generated_markers:
        head = "\n".join(lines[: cfg.marker_lines]).lower()
        if any(marker.lower() in head for marker in cfg.generated_markers):
            return "generated_marker"
    entropy = byte_entropy(text.encode("utf-8", errors="surrogatepass"))
    if entropy < cfg.min_byte_entropy:
        return "low_entropy"
    if entropy > cfg.max_byte_entropy:
        return "high_entropy"
    return None


@lru_cache(maxsize=16)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def math_doc(text: str, cfg: MathFilterConfig) -> str | None:
    if len(text) < cfg.min_chars:
        return "too_short"
    if len(text) > cfg.max_chars:
        return "too_long"
    if len(_DIGITS.findall(text)) / len(text) < cfg.min_digit_fraction:
        return "too_few_digits"
    if len(_SYMBOLS.findall(text)) / len(text) > cfg.max_symbol_fraction:
        return "too_many_symbols"
    if max(map(len, text.splitlines() or [""])) > cfg.max_line_length:
        return "long_line"
    if cfg.require_pattern and not _compiled(cfg.require_pattern).search(text):
        return "missing_pattern"
    return None
