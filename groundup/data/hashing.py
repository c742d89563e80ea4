"""64-bit hashing helpers shared by the repetition filters, MinHash and the classifier."""

from __future__ import annotations

import numpy as np
import xxhash

MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: a multiply-add by it keeps the order of what it combines
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_KEEP_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


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


def hash_words(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of the space-separated words in `data`, all at once with numpy, and where
    each word starts in `data`.

    Each word is read as little-endian 8-byte chunks (zero-padded), folded in with
    `h = fmix64((h ^ chunk) * C1)` starting from its length, and finalised with fmix64: the
    xor-multiply-mix structure of xxhash's core loop, but vectorised across words, so a corpus
    of millions of words costs a few array passes instead of a Python call per word.
    """
    arr = np.frombuffer(data, dtype=np.uint8)
    is_word = np.concatenate(([False], arr != 32, [False]))
    edges = np.flatnonzero(is_word[1:] != is_word[:-1])
    starts, ends = edges[0::2], edges[1::2]
    lengths = ends - starts
    padded = np.frombuffer(data + bytes(8), dtype=np.uint8)
    # An (unaligned) little-endian 8-byte integer starting at every byte of `data`.
    at = np.ndarray(shape=(len(arr) + 1,), dtype="<u8", buffer=padded, strides=(1,))
    with np.errstate(over="ignore"):
        # First chunk of every word, without index arrays (most words fit in 8 bytes) ...
        h = fmix64((lengths.astype(np.uint64) * MIX ^ (at[starts] & _KEEP_BYTES[np.minimum(lengths, 8)])) * _C1)
        active = np.flatnonzero(lengths > 8)
        chunk_no = 1
        while active.size:  # ... then the next chunks of the longer ones
            left = np.minimum(lengths[active] - 8 * chunk_no, 8)
            chunk = at[starts[active] + 8 * chunk_no] & _KEEP_BYTES[left]  # zero the bytes past the end
            h[active] = fmix64((h[active] ^ chunk) * _C1)
            chunk_no += 1
            active = active[lengths[active] > 8 * chunk_no]
        return fmix64(h), starts


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


def split_score(data: bytes, seed: int = 0) -> float:
    """Where bytes fall in [0, 1) under a seeded xxh64: a split that depends on content alone."""
    return xxhash.xxh64_intdigest(data, seed) / 2.0**64


def document_score(text: str, seed: int = 0) -> float:
    """Where a document falls in [0, 1): the token shards' val split and the tokenizer's held-out set use it."""
    return split_score(text.encode("utf-8", "surrogatepass"), seed)


def record_score(text: str, seed: int = 0, group=None, group_scale: float = 1.0) -> float:
    """`document_score`, or, for a record in a group (`group`: the value of its group field, e.g. the
    work a chunk comes from), the group's score: a group's documents fall on the same side of every
    split. `group_scale` (a fraction / the groups' own fraction) holds out groups at their own rate:
    a few dozen works need a larger share than thousands of documents to leave any out."""
    if group is not None and group != "":
        return split_score(str(group).encode("utf-8", "surrogatepass"), seed) * group_scale
    return document_score(text, seed)
