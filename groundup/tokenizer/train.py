"""Train the byte-level BPE with the `tokenizers` library's BPE trainer.

    cfg = TokenizerConfig(vocab_size=8192)
    tok = train_tokenizer(texts, cfg)          # texts: any iterable of str
    tok.save("out/tokenizer")

The trainer sees text exactly as the encoder will: split by the same regex, mapped to byte-level
characters, with all 256 bytes in the initial alphabet (so no byte is ever unknown). Special tokens
are not given to the trainer; they are appended after the learned vocabulary, so `vocab_size`
counts them: 256 bytes + merges + 7 specials = vocab_size.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterable, Iterator, Literal

from groundup.config import fail
from groundup.errors import DataError
from groundup.tokenizer.chat import SPECIAL_TOKENS
from groundup.tokenizer.hf_format import PATTERN_NAMES, split_pattern, unicode_to_byte
from groundup.tokenizer.tokenizer import Tokenizer

MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


@dataclasses.dataclass
class TokenizerConfig:
    vocab_size: int = 32_768  # including the 256 byte tokens and the special tokens
    pattern: Literal["gpt4-fast", "gpt4"] = "gpt4-fast"  # split regex; see hf_format for the difference
    digit_group: int = 3  # numbers split into groups of 1..digit_group digits (1-2 is slightly better)
    min_frequency: int = 2  # a pair seen fewer times is never merged
    max_token_bytes: int | None = None  # cap a token's length (None: no cap)
    holdout_fraction: float = 0.01  # documents kept out of training for `tokenizer stats`
    seed: int = 0  # of the document hash that picks the held-out documents

    def validate(self) -> None:
        assert self.pattern in PATTERN_NAMES
        if self.vocab_size < MIN_VOCAB:
            fail("vocab_size", self.vocab_size,
                 f"at least {MIN_VOCAB} (256 byte tokens + {len(SPECIAL_TOKENS)} special tokens)")
        if not 1 <= self.digit_group <= 9:
            fail("digit_group", self.digit_group, "an integer from 1 to 9")
        if self.min_frequency < 1:
            fail("min_frequency", self.min_frequency, "an integer >= 1")
        if self.max_token_bytes is not None and self.max_token_bytes < 2:
            fail("max_token_bytes", self.max_token_bytes, "an integer >= 2, or none")
        if not 0.0 <= self.holdout_fraction < 1.0:
            fail("holdout_fraction", self.holdout_fraction, "a number in [0, 1)")


class _Counted:
    """Pass texts through, counting documents and UTF-8 bytes (the trainer consumes the iterator)."""

    def __init__(self, texts: Iterable[str]):
        self.texts, self.documents, self.bytes = texts, 0, 0

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            if text:
                self.documents += 1
                self.bytes += len(text.encode("utf-8"))
                yield text


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig | None = None, progress: bool = True) -> Tokenizer:
    """Train on `texts` and return the Tokenizer (not yet saved). Raises DataError on empty input."""
    from tokenizers import Regex, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer

    cfg = cfg or TokenizerConfig()
    cfg.validate()
    pattern = split_pattern(cfg.pattern, cfg.digit_group)
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size - len(SPECIAL_TOKENS),
        min_frequency=cfg.min_frequency,
        show_progress=progress,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=cfg.max_token_bytes,
    )
    counted = _Counted(texts)
    start = time.perf_counter()
    hf.train_from_iterator(counted, trainer)
    seconds = time.perf_counter() - start
    if counted.bytes == 0:
        raise DataError("no text to train the tokenizer on: every input record was empty")
    # The trainer numbers the alphabet in character order, then one token per merge in merge order.
    # groundup wants byte order first (id == byte value), then the merged tokens in merge order.
    table = unicode_to_byte()
    by_id = sorted(hf.get_vocab().items(), key=lambda kv: kv[1])
    learned = [bytes(table[c] for c in piece) for piece, _ in by_id]
    merged = [t for t in learned if len(t) > 1]
    meta = {"trained": {**dataclasses.asdict(cfg), "documents": counted.documents, "bytes": counted.bytes,
                        "seconds": round(seconds, 3)}}
    tok = Tokenizer.from_trained([bytes([b]) for b in range(256)] + merged, pattern, meta)
    tok.meta["trained"]["dropped_tokens"] = len(merged) + 256 - len(tok.tokens)
    return tok
