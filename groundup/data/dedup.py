"""Exact and near-duplicate removal across all shards, in bounded memory.

Each curated shard leaves two small arrays on disk: `exact-NNNNN.npy` (one 64-bit hash of the
normalised text per document) and `bands-NNNNN.npy` (documents x bands MinHash band keys). Here
they are read back one band at a time, memory-mapped, and split by the top bits of the key into
as many buckets as `dedup.minhash.memory_mb` needs, so one pass holds at most about that much no
matter how large the corpus. Within a bucket a sort brings equal keys together; each run of
equal keys joins its documents in a union-find over global document numbers (one int64 per
document is the only array that grows with the corpus).

The document kept from each exact group or near-duplicate cluster is the first in input order,
so a rerun keeps the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from groundup.data.minhash import NO_KEY


class UnionFind:
    def __init__(self, n: int):
        self.parent = np.arange(n, dtype=np.int64)

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:  # path compression: later finds are one step
            parent[x], x = root, parent[x]
        return int(root)

    def union_all(self, members: np.ndarray) -> None:
        """Join all `members` into one set whose root is the smallest of their roots."""
        roots = {self.find(int(m)) for m in members}
        smallest = min(roots)
        for r in roots:
            self.parent[r] = smallest

    def roots(self) -> np.ndarray:
        """The root of every element (fully compressed), vectorised."""
        parent = self.parent
        while True:
            grand = parent[parent]
            if np.array_equal(grand, parent):
                return parent
            parent[:] = grand


def _runs(keys: np.ndarray, ids: np.ndarray) -> Iterator[np.ndarray]:
    """Groups of `ids` (two or more) whose `keys` are equal."""
    if len(keys) < 2:
        return
    order = np.argsort(keys, kind="stable")
    keys, ids = keys[order], ids[order]
    boundaries = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [len(keys)]))
    for s, e in zip(starts[(ends - starts) > 1], ends[(ends - starts) > 1]):
        yield ids[s:e]


def _bucketed_groups(files: Sequence[Path], offsets: np.ndarray, column: int | None, alive: np.ndarray,
                     buckets: int) -> Iterator[np.ndarray]:
    """Equal-key groups of global document numbers over all shards, one key bucket at a time."""
    shift = np.uint64(64 - max(1, (buckets - 1).bit_length()))
    for bucket in range(buckets):
        key_parts, id_parts = [], []
        for shard, path in enumerate(files):
            keys = np.load(path, mmap_mode="r")
            keys = keys if column is None else keys[:, column]
            ids = np.arange(offsets[shard], offsets[shard + 1])
            keep = alive[ids] & (np.asarray(keys) != NO_KEY)
            if buckets > 1:
                keep &= (np.asarray(keys) >> shift) == np.uint64(bucket)
            key_parts.append(np.asarray(keys)[keep])
            id_parts.append(ids[keep])
        if key_parts:
            yield from _runs(np.concatenate(key_parts), np.concatenate(id_parts))


@dataclass
class DedupResult:
    exact_duplicate: np.ndarray  # bool per document: an earlier document has the same text
    near_duplicate: np.ndarray  # bool per document: in a MinHash cluster whose first member is kept
    exact_groups: int = 0
    clusters: list[np.ndarray] = field(default_factory=list)  # global numbers, size >= 2, largest first


def buckets_for(n_docs: int, memory_mb: int) -> int:
    """Buckets so that one pass (a key and a document number per entry) fits in `memory_mb`."""
    need = n_docs * 16
    return max(1, -(-need // (memory_mb << 20)))


def deduplicate(exact_files: Sequence[Path], band_files: Sequence[Path], counts: Sequence[int],
                alive: np.ndarray, near_eligible: np.ndarray, exact: bool, near: bool, bands: int,
                memory_mb: int) -> DedupResult:
    """`alive` marks documents still in the running (not removed by an earlier stage);
    `near_eligible` those whose domain takes part in near-duplicate removal."""
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    n = int(offsets[-1])
    buckets = buckets_for(n, memory_mb)
    exact_dup = np.zeros(n, dtype=bool)
    groups = 0
    if exact:
        for members in _bucketed_groups(exact_files, offsets, None, alive, buckets):
            exact_dup[members[members != members.min()]] = True
            groups += 1
    near_dup = np.zeros(n, dtype=bool)
    clusters: list[np.ndarray] = []
    if near:
        uf = UnionFind(n)
        live = alive & near_eligible & ~exact_dup
        for band in range(bands):
            for members in _bucketed_groups(band_files, offsets, band, live, buckets):
                uf.union_all(members)
        roots = uf.roots()
        clustered = np.flatnonzero(roots != np.arange(n))
        near_dup[clustered] = True  # every member but the root, which is the smallest number
        if clustered.size:
            order = np.argsort(roots[clustered], kind="stable")
            members, cluster_roots = clustered[order], roots[clustered][order]
            split = np.flatnonzero(cluster_roots[1:] != cluster_roots[:-1]) + 1
            for root, rest in zip(cluster_roots[np.concatenate(([0], split))], np.split(members, split)):
                clusters.append(np.concatenate(([root], rest)))
            clusters.sort(key=lambda c: (-len(c), int(c[0])))
    return DedupResult(exact_dup, near_dup, groups, clusters)
