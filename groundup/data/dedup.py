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

The work comes in independent pieces, which `--executor ray` runs as tasks (data/ray_dedup.py)
and `deduplicate` here runs one after the other: exact duplicates per key bucket
(`exact_duplicates_in_bucket`), then the groups sharing a band key per band and key bucket
(`band_groups_in_bucket`, datatrove's MinhashDedupBuckets), then one union-find over all groups
(`cluster`, its MinhashDedupCluster). Clusters do not depend on the order groups are joined in:
a cluster's root is always its smallest member.

With `dedup.near = "simhash"` the band files hold one column of SimHash fingerprints, and the
groups are the pairs at most k bits apart that each of k + 1 blocks and key bucket finds
(`simhash.pairs_in_bucket`); the buckets, the union-find and the keep-first rule are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from groundup.data.minhash import NO_KEY
from groundup.data.simhash import pairs_in_bucket


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


def bucket_groups(files: Sequence[Path], offsets: np.ndarray, column: int | None, alive: np.ndarray,
                  bucket: int, buckets: int) -> Iterator[np.ndarray]:
    """Groups of global document numbers (two or more, in increasing order) whose keys are equal,
    over all shards, for the keys of one bucket (the top bits of the key pick it). `column` is a
    band (the band-key files are documents x bands) or None (the exact-hash files)."""
    shift = np.uint64(64 - max(1, (buckets - 1).bit_length()))
    key_parts, id_parts = [], []
    for shard, path in enumerate(files):
        keys = np.load(path, mmap_mode="r")
        keys = np.asarray(keys if column is None else keys[:, column])
        ids = np.arange(offsets[shard], offsets[shard + 1])
        keep = np.asarray(alive[ids]) & (keys != NO_KEY)
        if buckets > 1:
            keep &= (keys >> shift) == np.uint64(bucket)
        key_parts.append(keys[keep])
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


def exact_duplicates_in_bucket(exact_files: Sequence[Path], offsets: np.ndarray, alive: np.ndarray, bucket: int,
                               buckets: int) -> tuple[np.ndarray, int]:
    """The documents of one key bucket whose text an earlier document has, and how many groups of
    equal texts the bucket holds."""
    duplicates, groups = [], 0
    for members in bucket_groups(exact_files, offsets, None, alive, bucket, buckets):
        duplicates.append(members[1:])  # members are in increasing order: the first is kept
        groups += 1
    return (np.concatenate(duplicates) if duplicates else np.zeros(0, dtype=np.int64)), groups


def band_groups_in_bucket(band_files: Sequence[Path], offsets: np.ndarray, live: np.ndarray, band: int, bucket: int,
                          buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents sharing a key of `band` within one key bucket, as (members of every group
    concatenated, each group's size): what the clustering joins."""
    groups = list(bucket_groups(band_files, offsets, band, live, bucket, buckets))
    members = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)
    return members, np.array([len(g) for g in groups], dtype=np.int64)


def cluster(n: int, groups: Iterable[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Union-find over `groups` of document numbers: the near-duplicate mark of every document (all
    members of a cluster but its first) and the clusters (first member first, largest first)."""
    uf = UnionFind(n)
    for members in groups:
        uf.union_all(members)
    roots = uf.roots()
    clustered = np.flatnonzero(roots != np.arange(n))
    near_dup = np.zeros(n, dtype=bool)
    near_dup[clustered] = True  # every member but the root, which is the smallest number
    clusters: list[np.ndarray] = []
    if clustered.size:
        order = np.argsort(roots[clustered], kind="stable")
        members, cluster_roots = clustered[order], roots[clustered][order]
        split = np.flatnonzero(cluster_roots[1:] != cluster_roots[:-1]) + 1
        for root, rest in zip(cluster_roots[np.concatenate(([0], split))], np.split(members, split)):
            clusters.append(np.concatenate(([root], rest)))
        clusters.sort(key=lambda c: (-len(c), int(c[0])))
    return near_dup, clusters


def near_groups(band_files: Sequence[Path], offsets: np.ndarray, live: np.ndarray, bands: int, buckets: int,
                simhash_k: int | None) -> Iterator[np.ndarray]:
    """The groups the clustering joins: documents sharing a MinHash band key, per band and bucket,
    or (`simhash_k` given: the band files hold SimHash fingerprints) pairs of fingerprints at most
    `simhash_k` bits apart, per block and bucket (data/simhash.py)."""
    if simhash_k is None:
        for band in range(bands):
            for bucket in range(buckets):
                yield from bucket_groups(band_files, offsets, band, live, bucket, buckets)
        return
    for block in range(simhash_k + 1):
        for bucket in range(buckets):
            members, _ = pairs_in_bucket(band_files, offsets, live, simhash_k, block, bucket, buckets)
            yield from members.reshape(-1, 2)


def deduplicate(exact_files: Sequence[Path], band_files: Sequence[Path], counts: Sequence[int],
                alive: np.ndarray, near_eligible: np.ndarray, exact: bool, near: bool, bands: int,
                memory_mb: int, simhash_k: int | None = None) -> DedupResult:
    """`alive` marks documents still in the running (not removed by an earlier stage);
    `near_eligible` those whose domain takes part in near-duplicate removal; `simhash_k` (None:
    MinHash) says the band files hold SimHash fingerprints, near-duplicates at most that many bits apart.

    The same stages that `--executor ray` runs as tasks (data/ray_dedup.py), one after the other."""
    offsets = shard_offsets(counts)
    n = int(offsets[-1])
    buckets = buckets_for(n, memory_mb)
    exact_dup = np.zeros(n, dtype=bool)
    groups = 0
    if exact:
        for bucket in range(buckets):
            duplicates, found = exact_duplicates_in_bucket(exact_files, offsets, alive, bucket, buckets)
            exact_dup[duplicates] = True
            groups += found
    near_dup = np.zeros(n, dtype=bool)
    clusters: list[np.ndarray] = []
    if near:
        live = near_live(alive, near_eligible, exact_dup)
        near_dup, clusters = cluster(n, near_groups(band_files, offsets, live, bands, buckets, simhash_k))
    return DedupResult(exact_dup, near_dup, groups, clusters)


def shard_offsets(counts: Sequence[int]) -> np.ndarray:
    """Global number of each shard's first document, then the total."""
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def near_live(alive: np.ndarray, near_eligible: np.ndarray, exact_dup: np.ndarray) -> np.ndarray:
    """Documents that near-deduplication looks at: alive, of an eligible domain, not exact copies."""
    return alive & near_eligible & ~exact_dup
