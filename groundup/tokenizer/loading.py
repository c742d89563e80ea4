"""`load_tokenizer(path)`: the one entry point that picks the backend for a tokenizer directory.

    tok = load_tokenizer("out/tokenizer")              # groundup's format -> Tokenizer
    tok = load_tokenizer("models/Qwen2.5-0.5B")         # any other tokenizer.json -> HFTokenizer

A directory (or its tokenizer.json) that holds groundup_tokenizer.json is groundup's own format
and gets the tiktoken-fast backend; anything else is read as a Hugging Face tokenizer. Missing,
unreadable or malformed files raise DataError naming the file, the key and the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

from groundup.errors import DataError
from groundup.layout import TOKENIZER_FILE, TOKENIZER_META_FILE
from groundup.tokenizer.base import BaseTokenizer
from groundup.tokenizer.hf_tokenizer import HFTokenizer
from groundup.tokenizer.tokenizer import Tokenizer


def load_tokenizer(path: str | os.PathLike) -> BaseTokenizer:
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    if not (path.is_dir() and (path / TOKENIZER_FILE).is_file()) and not path.is_file():
        raise DataError(f"{path}: tokenizer not found (expected a directory holding {TOKENIZER_FILE}, made by "
                        "'groundup tokenizer train', or a Hugging Face model directory)")
    if (directory / TOKENIZER_META_FILE).is_file():
        return Tokenizer.load(path)

    return HFTokenizer.load(path)
