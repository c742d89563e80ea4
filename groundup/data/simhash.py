"""SimHash fingerprints and their near-duplicate pairs (Hamming distance <= k), vectorised with numpy.

Charikar's SimHash (2002) over the same word n-gram shingles the MinHash path uses
(`minhash.shingle_batch`): each shingle's 64-bit hash is re-mixed with the seed
(`fmix64(h ^ fmix64(seed * MIX + MIX))`), and bit i of a document's fingerprint is set iff the sum over its
shingles (repeats counted) of +1 where the shingle's bit i is set and -1 where it is not is
positive. Two documents whose shingle multisets overlap mostly get fingerprints a few bits apart.
A document without shingles gets 0, which means "no fingerprint" (NO_KEY) and is never bucketed;
a real fingerprint of 0 (all 64 sums at or below zero, about 2^-64 for text) is treated the same.

Near-duplicates are pairs at Hamming distance <= k (3 for 64 bits, Manku et al. 2007), found by
the pigeonhole method of Manku's permuted tables: split the 64 bits into k + 1 blocks; two
fingerprints at distance <= k agree on at least one whole block. So for each block, the
fingerprints that share its value are the candidates, and each candidate pair's distance is
verified (`pairs_in_bucket`). Memory is bounded as the MinHash path bounds it (data/dedup.py):
one pass holds one block and one bucket of documents, the bucket picked by the top bits of a hash
of the block value, so equal block values always fall in the same bucket. A pass yields groups of
document numbers for dedup's union-find (`cluster`), which keeps each cluster's first document,
the same rule as MinHash's.

What k buys (benchmarks/simhash_recall.py, 8,293 corpus chunks and 600 planted copies): k = 3 finds
39% of the pairs MinHash (14 x 8) finds and nothing MinHash does not, k = 8 finds 80% at 95%
agreement, k = 10 90% at 94%. Fingerprints cost half of MinHash's band keys, but the candidates of
a block grow as N^2 / 2^(64 / (k + 1)), so a large k pays in the global pass on a large corpus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from groundup.data.curate_config import SimHashConfig
from groundup.data.hashing import MIX, fmix64
from groundup.data.minhash import NO_KEY, shingle_batch

BITS = 64
# The per-bit counts are summed in 16-bit lanes, four to a uint64: lane l of _LANES[h][b] is bit
# 4h + l of the byte b. A block of at most 65,535 shingles cannot carry a lane into the next.
_BLOCK = 65535
_LANES = np.array([[sum(((b >> (4 * h + lane)) & 1) << (16 * lane) for lane in range(4)) for b in range(256)]
                   for h in range(2)], dtype=np.uint64)


def _seed_mix(seed: int) -> np.uint64:
    return fmix64(np.array([seed], dtype=np.uint64) * MIX + MIX)[0]


def fingerprints_from(shingles: np.ndarray, offsets: np.ndarray, seed: int) -> np.ndarray:
    """One 64-bit SimHash per document from the concatenated shingle hashes and each document's
    offsets into them (`minhash.shingle_batch`'s output); 0 for a document without shingles.

    How many shingles have bit i set is counted per document, then bit i is set iff
    2 * count_i > shingles (the +1/-1 sum is positive). The counting is bit-sliced: for each of a
    hash's 8 bytes and each half of it, a table lookup spreads its 4 bits into 16-bit lanes of a
    uint64, and one `np.add.reduceat` per byte half sums 4 bits' counts of every document at once
    (16 passes over the shingles instead of 64). Blocks of `_BLOCK` shingles keep the lanes from
    overflowing; a document spanning blocks keeps a running count.
    """
    n_docs = len(offsets) - 1
    counts = np.zeros((n_docs, BITS), dtype=np.int64)
    mix = _seed_mix(seed)
    doc_starts = offsets[:-1][np.diff(offsets) > 0]
    for b0 in range(0, len(shingles), _BLOCK):
        b1 = min(b0 + _BLOCK, len(shingles))
        hashed = fmix64(shingles[b0:b1].astype(np.uint64) ^ mix).astype("<u8")
        by = hashed.view(np.uint8).reshape(-1, 8).T.copy()  # row j: byte j (bits 8j..8j+7) of every hash
        seg = np.concatenate(([b0], doc_starts[(doc_starts > b0) & (doc_starts < b1)]))
        docs = np.searchsorted(offsets, seg, side="right") - 1
        sums = np.empty((len(seg), 16), dtype="<u8")
        for j in range(8):
            for h in range(2):
                sums[:, 2 * j + h] = np.add.reduceat(_LANES[h][by[j]], seg - b0)
        counts[docs] += sums.view("<u2").reshape(len(seg), BITS)  # lane l of column 2j + h: bit 8j + 4h + l
    sizes = np.diff(offsets).astype(np.int64)
    set_bits = (2 * counts > sizes[:, None]).astype(np.uint8)
    return np.packbits(set_bits, axis=1, bitorder="little").view("<u8").reshape(n_docs).astype(np.uint64)


class SimHasher:
    def __init__(self, cfg: SimHashConfig):
        self.cfg = cfg

    def fingerprints_for_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(documents,) uint64 fingerprints; NO_KEY (0) for documents without shingles."""
        shingles, offsets = shingle_batch(texts, self.cfg.ngram)
        return fingerprints_from(shingles, offsets, self.cfg.seed)

    def keys_for_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(documents, 1): the fingerprints as the one column of a shard's `bands-NNNNN.npy`."""
        return self.fingerprints_for_texts(texts).reshape(-1, 1)


_M1, _M2, _M4, _H01 = (np.uint64(0x5555555555555555), np.uint64(0x3333333333333333), np.uint64(0x0F0F0F0F0F0F0F0F),
                       np.uint64(0x0101010101010101))


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bits that differ between `a` and `b`, element-wise (SWAR popcount: numpy 1.26 has no
    bitwise_count)."""
    x = np.bitwise_xor(a, b).astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x - ((x >> np.uint64(1)) & _M1)
        x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
        x = (x + (x >> np.uint64(4))) & _M4
        return ((x * _H01) >> np.uint64(56)).astype(np.int64)


def blocks(k: int) -> list[tuple[int, int]]:
    """(shift, width) of the k + 1 blocks that split 64 bits, widths differing by at most one."""
    count = k + 1
    widths = [BITS // count + (1 if i < BITS % count else 0) for i in range(count)]
    starts = np.concatenate(([0], np.cumsum(widths)[:-1]))
    return [(int(s), int(w)) for s, w in zip(starts, widths)]


def block_values(fingerprints: np.ndarray, k: int, block: int) -> np.ndarray:
    shift, width = blocks(k)[block]
    mask = np.uint64((1 << width) - 1)
    return (fingerprints >> np.uint64(shift)) & mask


def bucket_of(values: np.ndarray, block: int, buckets: int) -> np.ndarray:
    """Which of `buckets` each block value falls in: the top bits of a hash of it, so that values
    of any width spread evenly."""
    shift = np.uint64(64 - max(1, (buckets - 1).bit_length()))
    with np.errstate(over="ignore"):
        return fmix64(values + np.uint64(block + 1) * MIX) >> shift


def candidate_pairs(values: np.ndarray, fingerprints: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """(pairs, 2) document ids (smaller first, each pair once, sorted) at Hamming distance <= k
    among documents whose block `values` are equal.

    Sorted by (value, fingerprint), equal values are runs; every pair within a run is compared by
    stepping a distance d = 1, 2, ... along the sorted order, keeping only positions whose run is
    still longer than d, so the work is the number of candidate pairs, not runs x longest run."""
    order = np.lexsort((ids, fingerprints, values))
    values, fingerprints, ids = values[order], fingerprints[order], ids[order]
    found = []
    active = np.arange(len(values) - 1)
    d = 1
    while active.size:
        active = active[values[active + d] == values[active]]
        if not active.size:
            break
        close = active[hamming(fingerprints[active], fingerprints[active + d]) <= k]
        if close.size:
            found.append(np.stack((ids[close], ids[close + d]), axis=1))
        active = active[active + d + 1 < len(values)]
        d += 1
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    pairs = np.sort(np.concatenate(found), axis=1)
    return np.unique(pairs, axis=0)


def bucket_entries(files: Sequence[Path], offsets: np.ndarray, live: np.ndarray, k: int, block: int, bucket: int,
                   buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block values, fingerprints, global document numbers) of the live documents of one block
    bucket, over all shards' fingerprint files (column 0 of `bands-NNNNN.npy`, memory-mapped)."""
    vals, fps, docs = [], [], []
    for shard, path in enumerate(files):
        column = np.load(path, mmap_mode="r")
        column = np.asarray(column[:, 0] if column.ndim == 2 else column)
        ids = np.arange(offsets[shard], offsets[shard + 1])
        keep = np.asarray(live[ids]) & (column != NO_KEY)
        values = block_values(column, k, block)
        if buckets > 1:
            keep &= bucket_of(values, block, buckets) == np.uint64(bucket)
        vals.append(values[keep])
        fps.append(column[keep])
        docs.append(ids[keep])
    if not vals:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.int64)
    return np.concatenate(vals), np.concatenate(fps), np.concatenate(docs).astype(np.int64)


def pairs_in_bucket(files: Sequence[Path], offsets: np.ndarray, live: np.ndarray, k: int, block: int, bucket: int,
                    buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """The near-duplicate pairs found through one block and bucket, as groups for the clustering:
    (members of every group concatenated, each group's size), every group a pair. Documents with
    equal fingerprints are first collapsed to their smallest number (one group per run of equal
    fingerprints), so a thousand copies cost a thousand members, not half a million pairs."""
    values, fps, ids = bucket_entries(files, offsets, live, k, block, bucket, buckets)
    groups = []
    if len(fps) > 1:
        order = np.lexsort((ids, fps))
        fps_sorted, ids_sorted = fps[order], ids[order]
        first = np.concatenate(([True], fps_sorted[1:] != fps_sorted[:-1]))
        run = np.cumsum(first) - 1
        sizes = np.bincount(run)
        reps = ids_sorted[first]
        if (sizes > 1).any():  # [representative, copy] for each copy
            copies = ~first
            groups.append(np.stack((reps[run[copies]], ids_sorted[copies]), axis=1))
        rep_fps = fps_sorted[first]
        groups.append(candidate_pairs(block_values(rep_fps, k, block), rep_fps, reps, k))
    members = np.concatenate(groups).reshape(-1) if groups else np.zeros(0, dtype=np.int64)
    return members.astype(np.int64), np.full(len(members) // 2, 2, dtype=np.int64)
