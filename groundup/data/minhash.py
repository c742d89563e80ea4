"""MinHash signatures and LSH band keys, vectorised with numpy.

A document is the set of its word 5-grams (lower-cased `\\w+` words). Words are hashed to 64 bits
all at once by `hashing.hash_words` (xxhash's xor-multiply-mix loop, vectorised: a Python call per
word made this twice as slow), a shingle's hash combines its words' hashes (multiply-add, then
splitmix64's finaliser), and each of the bands x rows permutations is
`a * h + b` in wrapping uint64 arithmetic with odd `a` (a bijection on 64-bit values), whose high and
low 32 bits serve as two rows of the signature (`MinHasher.signatures_from`). Shingles of
many documents are concatenated, so 20,000 short math problems cost a few array operations, not
20,000 Python loops.

A band's key is a 64-bit hash of its `rows` minima: two documents with Jaccard similarity s share
at least one band key with probability 1 - (1 - s^rows)^bands (0.92 at s = 0.8 for 14 x 8, 0.999
at s = 0.9).
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from groundup.data.curate_config import MinHashConfig
from groundup.data.hashing import MIX, fmix64, hash_words, window_hashes

_WORDS = re.compile(r"\w+")
_BLOCK = 2048  # shingles per block: block x permutations x 8 bytes (1.8 MB) stays in cache
NO_KEY = np.uint64(0)  # band keys of a document without shingles: never bucketed

# ASCII text: one bytes.translate lower-cases and turns every non-word byte into a space, and
# split() does the rest, the same words as `\w+` on the lower-cased text at several times the speed.
_ASCII_WORDS = bytes((c + 32 if 65 <= c <= 90 else c) if (chr(c).isalnum() or c == 95) and c < 128 else 32
                     for c in range(256))


def _word_bytes(text: str) -> bytes:
    """The lower-cased `\\w+` words of `text` as UTF-8, separated by spaces."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_WORDS)
    # the same bytes a word has in an ASCII document, so it hashes alike in both
    return b" ".join(w.encode("utf-8", errors="surrogatepass") for w in _WORDS.findall(text.lower()))


def word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """All documents' word hashes, concatenated, and each document's word count: one
    `hash_words` call for the whole batch."""
    parts = [_word_bytes(t) for t in texts]
    ends = np.cumsum([len(p) + 1 for p in parts])  # + 1: the space that joins them
    hashes, starts = hash_words(b" ".join(parts))
    bounds = np.searchsorted(starts, ends - 1)
    return hashes, np.diff(np.concatenate(([0], bounds)))


def shingle_batch(texts: Sequence[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes of many documents, concatenated, and each document's offsets into them.

    Windows are computed once over all documents' words together and those that cross a document
    boundary are dropped; a document with fewer than `n` words is one shingle of all its words.
    Repeated shingles are kept: they cannot change a minimum.
    """
    words, lengths = word_hashes(texts)
    counts = np.where(lengths >= n, lengths - n + 1, np.minimum(lengths, 1))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    out = np.empty(int(offsets[-1]), dtype=np.uint64)
    word_ends = np.cumsum(lengths)
    if len(words) >= n:
        ends = np.repeat(word_ends, lengths)[: len(words) - n + 1]
        valid = np.arange(len(words) - n + 1) + n <= ends
        out[np.repeat(lengths >= n, counts)] = fmix64(window_hashes(words, n)[valid])
    for doc in np.flatnonzero((lengths > 0) & (lengths < n)):
        start = word_ends[doc] - lengths[doc]
        out[offsets[doc]] = fmix64(window_hashes(words[start:word_ends[doc]], int(lengths[doc])))[0]
    return out, offsets


def shingle_hashes(text: str, n: int) -> np.ndarray:
    """The distinct shingle hashes of one document (its set, for exact Jaccard)."""
    return np.unique(shingle_batch([text], n)[0])


class MinHasher:
    def __init__(self, cfg: MinHashConfig):
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        self.count = cfg.bands * cfg.rows
        pairs = (self.count + 1) // 2  # each 64-bit permutation gives two 32-bit values (see signatures_from)
        self.a = rng.integers(0, np.iinfo(np.uint64).max, pairs, dtype=np.uint64, endpoint=True) | np.uint64(1)
        self.b = rng.integers(0, np.iinfo(np.uint64).max, pairs, dtype=np.uint64, endpoint=True)

    def signatures_from(self, shingles: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """(documents, bands * rows) uint32 minima; a document without shingles gets all-max values.

        Each 64-bit permutation `a * h + b` yields two signature values, its high and its low 32
        bits (two hash functions of the 64-bit shingle hash: the high half depends on all of h,
        the low half is a bijection of h's low half), so one multiply-add serves two rows and the
        minimum runs over half the bytes; 32-bit values are what datasketch keeps too. Blocks of
        `_BLOCK` shingles go through one preallocated buffer that stays in cache; within a block
        each document is one segment (`np.minimum.reduceat`), and a document spanning blocks
        keeps a running minimum.
        """
        n_docs = len(offsets) - 1
        pairs = len(self.a)
        sig = np.full((n_docs, 2 * pairs), np.iinfo(np.uint32).max, dtype=np.uint32)
        buf = np.empty((_BLOCK, pairs), dtype=np.uint64)
        halves = buf.view(np.uint32)  # (block, 2 * pairs): low, high, low, high, ... (little-endian)
        doc_starts = offsets[:-1][np.diff(offsets) > 0]
        with np.errstate(over="ignore"):
            for b0 in range(0, len(shingles), _BLOCK):
                b1 = min(b0 + _BLOCK, len(shingles))
                block = buf[: b1 - b0]
                np.multiply(shingles[b0:b1, None], self.a, out=block)
                block += self.b
                seg = np.concatenate(([b0], doc_starts[(doc_starts > b0) & (doc_starts < b1)]))
                docs = np.searchsorted(offsets, seg, side="right") - 1
                sig[docs] = np.minimum(sig[docs], np.minimum.reduceat(halves[: b1 - b0], seg - b0, axis=0))
        return sig[:, : self.count]

    def signatures(self, shingles: Sequence[np.ndarray]) -> np.ndarray:
        sizes = np.array([len(s) for s in shingles], dtype=np.int64)
        flat = np.concatenate(shingles) if len(shingles) else np.zeros(0, dtype=np.uint64)
        return self.signatures_from(flat, np.concatenate(([0], np.cumsum(sizes))))

    def band_keys(self, signatures: np.ndarray, has_shingles: np.ndarray) -> np.ndarray:
        """(documents, bands) 64-bit keys; NO_KEY for documents without shingles."""
        bands, rows = self.cfg.bands, self.cfg.rows
        sig = signatures.reshape(len(signatures), bands, rows)
        with np.errstate(over="ignore"):
            key = np.zeros((len(signatures), bands), dtype=np.uint64)
            for r in range(rows):
                key = fmix64(key * MIX + sig[:, :, r].astype(np.uint64))
        key[key == NO_KEY] = np.uint64(1)  # keep NO_KEY free to mean "no key"
        key[~has_shingles] = NO_KEY
        return key

    def keys_for_texts(self, texts: Sequence[str]) -> np.ndarray:
        shingles, offsets = shingle_batch(texts, self.cfg.ngram)
        return self.band_keys(self.signatures_from(shingles, offsets), np.diff(offsets) > 0)


def collision_probability(similarity: float, bands: int, rows: int) -> float:
    return 1.0 - (1.0 - similarity ** rows) ** bands
