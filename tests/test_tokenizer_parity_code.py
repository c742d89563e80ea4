"""Encoder parity (see test_tokenizer_parity.py) on the standard-library half of the corpus."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_tokenizer_parity import assert_same_ids, pair  # noqa: E402, F401  (pair is a fixture)

from groundup.corpus import iter_corpus  # noqa: E402


def test_parity_on_the_whole_standard_library(pair):
    texts = [r["text"] for r in iter_corpus(["code"])]
    assert sum(map(len, texts)) > 5_000_000
    assert_same_ids(*pair, texts)
