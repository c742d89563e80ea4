"""Train the byte-level BPE with the `tokenizers` library's BPE trainer.

    cfg = TokenizerConfig(vocab_size=8192)
    tok = train_tokenizer(texts, cfg)          # texts: any iterable of str
    tok.save("out/tokenizer")

The trainer sees text exactly as the encoder will: split by the same regex, mapped to byte-level
characters, with all 256 bytes in the initial alphabet (so no byte is ever unknown). Special tokens
and the tool tags are not given to the trainer; they are appended after the learned vocabulary, so
`vocab_size` counts them: 256 bytes + merges + 7 specials + 4 tool tags = vocab_size.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Iterable, Iterator, Literal

from groundup.config import fail
from groundup.errors import DataError
from groundup.tokenizer.chat import SPECIAL_TOKENS, TOOL_TOKENS
from groundup.tokenizer.hf_format import PATTERN_NAMES, split_pattern, unicode_to_byte
from groundup.tokenizer.tokenizer import Tokenizer

MIN_VOCAB = 256 + len(SPECIAL_TOKENS) + len(TOOL_TOKENS)
MAX_VOCAB = 1 << 21  # 2M: far past any open model; a typo (1e9) must fail here, not abort the Rust trainer


@dataclasses.dataclass
class TokenizerConfig:
    vocab_size: int = 32_768  # including the 256 byte tokens and the special tokens
    pattern: Literal["gpt4-fast", "gpt4"] = "gpt4-fast"  # split regex; see hf_format for the difference
    digit_group: int = 3  # numbers split into groups of 1..digit_group digits (1-2 is slightly better)
    min_frequency: int = 2  # a pair seen fewer times is never merged
    max_token_bytes: int | None = None  # cap a token's length (None: no cap)
    holdout_fraction: float = 0.01  # documents kept out of training for `tokenizer stats`
    seed: int = 0  # of the document hash that picks the held-out documents
    holdout_group: str = ""  # a record field: documents of one group are held out together (= tokenize's split_group)
    holdout_group_fraction: float = 0.0  # the share of groups held out; 0: holdout_fraction (= split_group_fraction)

    def validate(self) -> None:
        if self.pattern not in PATTERN_NAMES:
            fail("pattern", self.pattern, f"one of {', '.join(PATTERN_NAMES)}")
        if self.vocab_size < MIN_VOCAB:
            fail("vocab_size", self.vocab_size,
                 f"at least {MIN_VOCAB} (256 byte tokens + {len(SPECIAL_TOKENS)} special tokens + "
                 f"{len(TOOL_TOKENS)} tool tags)")
        if self.vocab_size > MAX_VOCAB:
            fail("vocab_size", self.vocab_size, f"at most {MAX_VOCAB:,}")
        if not 1 <= self.digit_group <= 9:
            fail("digit_group", self.digit_group, "an integer from 1 to 9")
        if self.min_frequency < 1:
            fail("min_frequency", self.min_frequency, "an integer >= 1")
        if self.max_token_bytes is not None and self.max_token_bytes < 2:
            fail("max_token_bytes", self.max_token_bytes, "an integer >= 2, or none")
        if not 0.0 <= self.holdout_fraction < 1.0:
            fail("holdout_fraction", self.holdout_fraction, "a number in [0, 1)")



# A newline followed by an ASCII letter is a piece boundary under every split pattern here (the
# newline ends its piece, the letter starts one), so cutting texts there changes no word count.
_SAFE_CUT = re.compile(r"\n[A-Za-z]")
CHUNK_CHARS = 8192


def _chunks(text: str, size: int) -> Iterator[str]:
    """Cut a long text at safe boundaries into pieces of about `size` characters.

    The trainer parallelises over the texts it is given and pulls them in buffers of 256, so a few
    whole books would leave a core idle and make a progress bar jump to the end at once; 8 KB
    pieces keep both cores busy (2.1 s instead of 5.7 s for Shakespeare at vocabulary 8,192 on an
    idle machine) and give the identical vocabulary.
    """
    pos = 0
    while len(text) - pos > size:
        m = _SAFE_CUT.search(text, pos + size)
        if m is None:
            break
        yield text[pos : m.start() + 1]
        pos = m.start() + 1
    yield text[pos:]


class _Counted:
    """Pass texts to the trainer in chunks, counting documents and bytes and showing progress.

    The trainer pre-tokenizes and counts words as it pulls chunks, which is most of its time, so a
    bar over the bytes pulled is its progress; then it computes the merges (a few seconds), which
    is announced when the input runs out. The trainer's own bars are off: they only draw on a
    terminal, and there they fight with this one for the line.
    """

    def __init__(self, texts: Iterable[str], progress: bool, merges: int):
        from tqdm import tqdm

        self.texts, self.documents, self.bytes, self.merges = texts, 0, 0, merges
        self.bar = tqdm(desc="pre-tokenize", unit="B", unit_scale=True, disable=not progress)

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            if text:
                n = len(text.encode("utf-8", "surrogatepass"))
                self.documents += 1
                self.bytes += n
                self.bar.update(n)
                yield from _chunks(text, CHUNK_CHARS)
        if not self.bar.disable:
            self.bar.set_postfix_str(f"learning up to {self.merges:,} merges", refresh=True)
        self.bar.close()


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
        vocab_size=cfg.vocab_size - len(SPECIAL_TOKENS) - len(TOOL_TOKENS),
        min_frequency=cfg.min_frequency,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=cfg.max_token_bytes,
    )
    counted = _Counted(texts, progress, cfg.vocab_size - MIN_VOCAB)
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
