"""Exact and MinHash deduplication as Ray stages, in bounded memory per task (data/dedup.py's pieces).

The signatures were computed where the shards were curated: each shard's `exact-*.npy` and
`bands-*.npy` (data/curate_shard.py, datatrove's MinhashDedupSignature). Then, in
`OUT/.work/dedup/`:

1. exact: one task per key bucket finds the documents whose text an earlier document has
   (`exact-BBBB.npz`). The driver joins them into one mask (a byte per document).
2. band buckets: one task per band and key bucket finds the groups of documents that share a key
   (`band-BBB-KKKK.npz`, datatrove's MinhashDedupBuckets). A task reads one band column of every
   shard, memory-mapped, and keeps only its bucket's keys: `dedup.minhash.memory_mb` bounds it.
   With `dedup.near = "simhash"`: one task per SimHash block and bucket finds the pairs of
   fingerprints at most k bits apart (`block-BBB-KKKK.npz`, data/simhash.py), bounded by
   `dedup.simhash.memory_mb`.
3. clusters: one task joins all groups in a union-find over document numbers (8 bytes per
   document) and writes the near-duplicate mask and the clusters (`clusters.npz`, datatrove's
   MinhashDedupCluster). Dropping the duplicates happens when the output shards are written.

The masks a stage reads (`alive.npy`, `live.npy`) are written by the driver before it starts. Every
result file is a completion marker (written under a temporary name, then renamed): a relaunch
skips the tasks whose file exists. The result equals `dedup.deduplicate`'s, which runs the same
functions one after the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from groundup.data import dedup
from groundup.data.curate_config import CurateConfig
from groundup.data.dedup import (DedupResult, band_groups_in_bucket, cluster, exact_duplicates_in_bucket, near_live,
                                 shard_offsets)
from groundup.data.simhash import pairs_in_bucket
from groundup.io import atomic_open, ensure_writable_dir
from groundup.ray_cluster import maybe_fault, remove_temporaries, require_shared, run_tasks


def _save(path: Path, **arrays: np.ndarray) -> None:
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)


def _save_mask(path: Path, mask: np.ndarray) -> str:
    with atomic_open(path, "wb") as f:
        np.save(f, mask)
    return str(path)


def exact_task(exact_files: list[str], offsets: np.ndarray, alive_path: str, bucket: int, buckets: int, out: str,
               fault: str | None) -> None:
    require_shared(Path(out).parent)
    remove_temporaries(Path(out).parent, Path(out).name)
    maybe_fault(fault, "exact", bucket, Path(out).parent)
    alive = np.load(alive_path, mmap_mode="r")
    duplicates, groups = exact_duplicates_in_bucket(list(map(Path, exact_files)), offsets, alive, bucket, buckets)
    _save(Path(out), duplicates=duplicates, groups=np.int64(groups))


def band_task(band_files: list[str], offsets: np.ndarray, live_path: str, band: int, bucket: int, buckets: int,
              out: str, fault: str | None, simhash_k: int | None = None) -> None:
    """One MinHash band's bucket, or (`simhash_k` given) one SimHash block's bucket."""
    require_shared(Path(out).parent)
    remove_temporaries(Path(out).parent, Path(out).name)
    maybe_fault(fault, "band", band * buckets + bucket, Path(out).parent)
    live = np.load(live_path, mmap_mode="r")
    if simhash_k is None:
        members, sizes = band_groups_in_bucket(list(map(Path, band_files)), offsets, live, band, bucket, buckets)
    else:
        members, sizes = pairs_in_bucket(list(map(Path, band_files)), offsets, live, simhash_k, band, bucket, buckets)
    _save(Path(out), members=members, sizes=sizes)


def _groups(paths: Sequence[str]):
    for path in paths:  # one band bucket's groups in memory at a time
        with np.load(path) as data:
            members, sizes = data["members"], data["sizes"]
        yield from np.split(members, np.cumsum(sizes)[:-1]) if len(sizes) else ()


def cluster_task(n: int, group_files: list[str], out: str, fault: str | None) -> None:
    require_shared(Path(out).parent)
    remove_temporaries(Path(out).parent, Path(out).name)
    maybe_fault(fault, "cluster", 0, Path(out).parent)
    near_dup, clusters = cluster(n, _groups(group_files))
    flat = np.concatenate(clusters) if clusters else np.zeros(0, dtype=np.int64)
    _save(Path(out), near_duplicate=near_dup, members=flat, sizes=np.array([len(c) for c in clusters], dtype=np.int64))


def ray_deduplicate(files: Sequence[dict], counts: Sequence[int], alive: np.ndarray, eligible: np.ndarray,
                    cfg: CurateConfig, work: Path, progress: bool, fault: str | None) -> DedupResult:
    """`dedup.deduplicate` for `cfg.dedup`, its pieces run as Ray tasks."""
    d = cfg.dedup
    offsets = shard_offsets(counts)
    n = int(offsets[-1])
    buckets = dedup.buckets_for(n, d.near_config().memory_mb)
    out = ensure_writable_dir(work / "dedup")
    exact_dup = np.zeros(n, dtype=bool)
    groups = 0
    if d.exact.enabled:
        alive_path = _save_mask(out / "alive.npy", alive)
        exact_files = [str(f["exact"]) for f in files]
        results = [out / f"exact-{b:04d}.npz" for b in range(buckets)]
        run_tasks(exact_task, [(f"exact dedup bucket {b}", (exact_files, offsets, alive_path, b, buckets, str(p), fault))
                               for b, p in enumerate(results) if not p.exists()], "exact dedup tasks", progress)
        for path in results:
            with np.load(path) as data:
                exact_dup[data["duplicates"]] = True
                groups += int(data["groups"])
    near_dup = np.zeros(n, dtype=bool)
    clusters: list[np.ndarray] = []
    if d.near_config().enabled:
        live_path = _save_mask(out / "live.npy", near_live(alive, eligible, exact_dup))
        band_files = [str(f["bands"]) for f in files]
        # SimHash: one task per block (k + 1 of them) and bucket, through the same task function
        simhash_k = d.simhash.k if d.near == "simhash" else None
        method, piece, pieces = (("SimHash", "block", d.simhash.k + 1) if simhash_k is not None
                                 else ("MinHash", "band", d.minhash.bands))
        results = {(band, b): out / f"{piece}-{band:03d}-{b:04d}.npz" for band in range(pieces) for b in range(buckets)}
        run_tasks(band_task, [(f"{method} {piece} {band} bucket {b}", (band_files, offsets, live_path, band, b, buckets,
                                                                       str(p), fault, simhash_k))
                              for (band, b), p in results.items() if not p.exists()],
                  f"{method} bucket tasks", progress)
        clustered = out / "clusters.npz"
        if not clustered.exists():
            run_tasks(cluster_task, [(f"{method} clustering", (n, [str(p) for p in results.values()], str(clustered),
                                                                 fault))], f"{method} cluster task", progress)
        with np.load(clustered) as data:
            near_dup = data["near_duplicate"]
            sizes = data["sizes"]
            clusters = np.split(data["members"], np.cumsum(sizes)[:-1]) if len(sizes) else []
    return DedupResult(exact_dup, near_dup, groups, clusters)
