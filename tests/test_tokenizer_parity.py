"""The fast encoder (tiktoken) gives exactly the ids of the saved tokenizer.json (`tokenizers`).

Checked over the whole embedded corpus: Shakespeare and 20,000 math problems here, the standard
library in test_tokenizer_parity_code.py (split so each file stays under a minute on 2 cores,
`tokenizers` encodes only about 2 MB/s here); plus random Unicode and the exact GPT-4 pattern.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_tokenizer import random_text  # noqa: E402
from tokenizer_helpers import small_corpus, trained_tokenizer_dir  # noqa: E402

from groundup.corpus import iter_corpus  # noqa: E402
from groundup.tokenizer import Tokenizer, TokenizerConfig, train_tokenizer  # noqa: E402
from groundup.layout import TOKENIZER_FILE  # noqa: E402


def assert_same_ids(tok: Tokenizer, hf, texts: list[str]) -> None:
    ours = tok.encode_batch(texts)
    theirs = [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]
    for a, b in zip(ours, theirs):
        if a != b:
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            pytest.fail(f"encoders differ at token {i} near {tok.decode(a[max(i - 3, 0):i + 3])!r}: "
                        f"{a[max(i - 3, 0):i + 3]} vs {b[max(i - 3, 0):i + 3]}")


def saved_pair(directory: Path):
    from tokenizers import Tokenizer as HFTokenizer

    return Tokenizer.load(directory), HFTokenizer.from_file(str(directory / TOKENIZER_FILE))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return saved_pair(trained_tokenizer_dir(tmp_path_factory))


@pytest.mark.parametrize("domain", ["text", "math"])
def test_parity_on_the_embedded_corpus(pair, domain):
    texts = [r["text"] for r in iter_corpus([domain])]
    assert len(texts) == {"text": 77, "math": 20_000}[domain]
    assert_same_ids(*pair, texts)


def test_parity_on_random_unicode(pair):
    rng = random.Random(5)
    assert_same_ids(*pair, [random_text(rng, rng.randint(1, 400)) for _ in range(500)])


def test_parity_with_the_exact_gpt4_pattern(tmp_path):
    texts = [r["text"] for r in small_corpus()]
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=2048, pattern="gpt4", digit_group=2), progress=False)
    tok.save(tmp_path)
    assert_same_ids(*saved_pair(tmp_path), texts)
