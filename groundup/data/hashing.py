"""64-bit hashing helpers shared by the repetition filters, MinHash and the classifier."""

from __future__ import annotations

import numpy as np
import xxhash

MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: a multiply-add by it keeps the order of what it combines
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


def fmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every output bit depends on every input bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _C1
        x = (x ^ (x >> np.uint64(27))) * _C2
        return x ^ (x >> np.uint64(31))


def window_hashes(h: np.ndarray, n: int) -> np.ndarray:
    """A hash of each window of `n` consecutive values of `h` (wrapping uint64 multiply-add)."""
    out = h[: len(h) - n + 1].copy()
    with np.errstate(over="ignore"):
        for k in range(1, n):
            out = out * MIX + h[k: len(h) - n + 1 + k]
    return out


class WordHash(dict):
    """word (str or ASCII bytes) -> xxhash of its UTF-8 bytes, the same value either way.

    Stable across processes (unlike `hash()`), so what one worker computes matches another's;
    each distinct word is hashed once and later looked up from C through `map(cache.__getitem__)`.
    """

    def __missing__(self, word: str | bytes) -> int:
        if len(self) > 1 << 20:  # bounded: code and typos make the vocabulary endless
            self.clear()
        data = word if isinstance(word, bytes) else word.encode("utf-8", errors="surrogatepass")
        value = self[word] = xxhash.xxh3_64_intdigest(data)
        return value


word_hash = WordHash()
