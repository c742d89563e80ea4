"""`curate`: the whole curation run, in three phases over shards of records.

1. Read the inputs in order and cut them into shards (`output.shard_docs` / `shard_bytes`); each
   shard is curated on its own (`curate_shard`), in `workers` processes, and leaves its survivors,
   dedup hashes and counters in `OUT/.work/`. A shard already complete there is skipped.
2. Global decisions over all shards: top-fraction classifier cut, decontamination against eval
   tasks (`decontaminate.tasks`, data/decontaminate.py), exact and MinHash dedup
   (`dedup`, bounded memory) and the mixing plan (`mixing`).
3. Each work shard becomes `OUT/shards/part-NNNNN.parquet` (or `.jsonl`): duplicates dropped,
   documents repeated or dropped by the mixing plan, rows shuffled; existing parts are kept.
Then `report.json` and `report.md` (see `report`).

A restart is only safe with the same inputs and settings, so `.work/manifest.json` records them
and a different run into the same directory stops with the differences listed.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import time
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow.parquet as pq

from groundup.config import config_diff, save_config
from groundup.data.curate_config import CurateConfig, fingerprint_dict
from groundup.data.curate_shard import ShardCurator, shard_complete, shard_files
from groundup.data.dedup import deduplicate
from groundup.data.mixing import assign_copies, plan_mix
from groundup.data.output import write_output_shard
from groundup.data.readers import ReadStats, iter_records
from groundup.data.report import build_report, write_report
from groundup.data.stats import StageStats
from groundup.errors import DataError
from groundup.io import atomic_write_json, ensure_writable_dir, read_json

_curator: ShardCurator | None = None  # one per worker process


def _init_worker(cfg: CurateConfig) -> None:
    global _curator
    _curator = ShardCurator(cfg)


def _run_shard(index: int, records: list[dict], work: Path) -> dict:
    return _curator(index, records, work)


def _input_fingerprint(paths: Sequence[Path]) -> list[dict]:
    out = []
    for p in paths:
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        out.append({"path": str(p.resolve()), "files": len(files),
                    "bytes": sum(f.stat().st_size for f in files),
                    "mtime": max((f.stat().st_mtime for f in files), default=0.0)})
    return out


def _check_manifest(work: Path, manifest: dict) -> None:
    path = work / "manifest.json"
    if path.exists():
        old = read_json(path)
        if old != manifest:
            diffs = config_diff(old.get("config", {}), manifest["config"])
            if old.get("inputs") != manifest["inputs"]:
                diffs.append("inputs changed")
            raise DataError(f"{work.parent} holds a curation run with other settings ({'; '.join(diffs[:8])}); "
                            "use a new --out directory or delete this one")
    atomic_write_json(path, manifest)


def _shards(records: Iterator[dict], max_docs: int, max_bytes: int) -> Iterator[tuple[int, list[dict]]]:
    batch, size, index = [], 0, 0
    for record in records:
        batch.append(record)
        size += len(record["text"])
        if len(batch) >= max_docs or size >= max_bytes:
            yield index, batch
            batch, size, index = [], 0, index + 1
    if batch:
        yield index, batch


def _curate_shards(inputs: Sequence[Path], cfg: CurateConfig, work: Path, read_stats: ReadStats,
                   progress: bool) -> tuple[list[dict], int]:
    """Phase 1. Returns every shard's stats (in order) and how many were skipped as complete."""
    from tqdm import tqdm

    records = iter_records(inputs, read_stats, cfg.read.default_domain, cfg.read.max_record_bytes)
    results: dict[int, dict] = {}
    skipped = 0
    bar = tqdm(desc="curate", unit=" docs", disable=not progress)
    if cfg.workers == 1:
        curator = ShardCurator(cfg)
        for index, batch in _shards(records, cfg.output.shard_docs, cfg.output.shard_bytes):
            if shard_complete(work, index):
                results[index], skipped = read_json(shard_files(work, index)["stats"]), skipped + 1
            else:
                results[index] = curator(index, batch, work)
            bar.update(len(batch))
    else:
        # spawn, not fork: pyarrow's thread pools do not survive a fork.
        context = multiprocessing.get_context("spawn")
        with futures.ProcessPoolExecutor(cfg.workers, mp_context=context, initializer=_init_worker,
                                         initargs=(cfg,)) as pool:
            pending: dict[futures.Future, int] = {}
            for index, batch in _shards(records, cfg.output.shard_docs, cfg.output.shard_bytes):
                if shard_complete(work, index):
                    results[index], skipped = read_json(shard_files(work, index)["stats"]), skipped + 1
                    bar.update(len(batch))
                    continue
                while len(pending) >= 2 * cfg.workers:  # bounded: the reader never runs far ahead
                    done, _ = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
                    for f in done:
                        results[pending.pop(f)] = f.result()
                pending[pool.submit(_run_shard, index, batch, work)] = index
                bar.update(len(batch))
            for f in futures.as_completed(pending):
                results[pending[f]] = f.result()
    bar.close()
    return [results[i] for i in sorted(results)], skipped


def _load_columns(work: Path, count: int) -> dict[str, np.ndarray]:
    """domain and source (as codes), bytes and classifier score of every surviving document."""
    parts: dict[str, list] = {"domain": [], "source": [], "nbytes": [], "quality": []}
    for index in range(count):
        table = pq.read_table(shard_files(work, index)["stage"], columns=list(parts))
        for name in parts:
            parts[name].append(table.column(name).to_numpy(zero_copy_only=False))
    out = {k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}
    out["quality"] = out["quality"].astype(np.float64)  # None -> nan
    return out


def _bulk_stage(stats: StageStats, name: str, cols: dict, before: np.ndarray, after: np.ndarray, reason: str) -> None:
    """Per-domain and per-source counts of a global stage from keep masks before and after it."""
    for group, key in (("by_domain", "domain"), ("by_source", "source")):
        values = cols[key]
        for value in np.unique(values[before]):
            sel = values == value
            stats.add_cell(name, group, str(value), int((sel & before).sum()), int(cols["nbytes"][sel & before].sum()),
                           int((sel & after).sum()), int(cols["nbytes"][sel & after].sum()), reason)


def _top_fraction(cfg: CurateConfig, cols: dict, alive: np.ndarray) -> np.ndarray:
    """Keep the best-scored `classifier.top_fraction` of each scored domain."""
    keep = alive.copy()
    for domain in cfg.classifier.domains:
        sel = alive & (cols["domain"] == domain) & ~np.isnan(cols["quality"])
        if sel.any():
            cut = np.quantile(cols["quality"][sel], 1.0 - cfg.classifier.top_fraction)
            keep[sel & (cols["quality"] < cut)] = False
    return keep


def curate(inputs: Sequence[str | Path], out: str | Path, cfg: CurateConfig, progress: bool = True) -> dict:
    """Run the whole curation into `out`; returns the report (also written as report.json/.md)."""
    started = time.perf_counter()
    inputs = [Path(p) for p in inputs]
    for p in inputs:
        if not p.exists():
            raise DataError(f"input not found: {p}")
    out = ensure_writable_dir(out)
    work = ensure_writable_dir(out / ".work")
    _check_manifest(work, {"inputs": _input_fingerprint(inputs), "config": fingerprint_dict(cfg)})
    save_config(cfg, out / "config.toml")

    read_stats = ReadStats()
    shard_results, skipped = _curate_shards(inputs, cfg, work, read_stats, progress)
    phase1 = time.perf_counter() - started

    t0 = time.perf_counter()
    stats = StageStats(cfg.output.examples, cfg.output.snippet_chars)
    for result in shard_results:
        stats.merge_dict(result["stages"])
    counts = [r["kept"] for r in shard_results]
    cols = _load_columns(work, len(shard_results))
    alive = np.ones(len(cols["domain"]), dtype=bool)
    if cfg.classifier.model and cfg.classifier.top_fraction is not None:
        keep = _top_fraction(cfg, cols, alive)
        _bulk_stage(stats, "classifier_top_fraction", cols, alive, keep, "below_top_fraction")
        alive = keep
    files = [shard_files(work, i) for i in range(len(shard_results))]
    if cfg.decontaminate.tasks:  # documents sharing a 13-gram with an eval item (data/decontaminate.py)
        from groundup.data.decontaminate import decontaminate_stage

        t1 = time.perf_counter()
        keep = decontaminate_stage(cfg.decontaminate, [f["stage"] for f in files], counts, alive, stats)
        _bulk_stage(stats, "decontaminate", cols, alive, keep, "overlaps_eval_item")
        stats.add_time("decontaminate", time.perf_counter() - t1)
        alive = keep
    eligible = np.isin(cols["domain"], cfg.dedup.minhash.domains)
    result = deduplicate([f["exact"] for f in files], [f["bands"] for f in files], counts, alive, eligible,
                         cfg.dedup.exact.enabled, cfg.dedup.minhash.enabled, cfg.dedup.minhash.bands,
                         cfg.dedup.minhash.memory_mb)
    after_exact = alive & ~result.exact_duplicate
    if cfg.dedup.exact.enabled:
        _bulk_stage(stats, "exact_dedup", cols, alive, after_exact, "duplicate_text")
    after_near = after_exact & ~result.near_duplicate
    if cfg.dedup.minhash.enabled:
        _bulk_stage(stats, "minhash_dedup", cols, after_exact & eligible, after_near & eligible, "near_duplicate")
    stats.add_time("minhash_dedup", time.perf_counter() - t0)  # the global pass: bucketing, union-find
    available = {str(d): int(cols["nbytes"][after_near & (cols["domain"] == d)].sum())
                 for d in np.unique(cols["domain"][after_near])} if after_near.any() else {}
    plan = plan_mix(available, cfg.mixing)
    copies = assign_copies(plan, cols["domain"], cols["nbytes"], after_near, cfg.seed, cfg.mixing.max_repeats)
    phase2 = time.perf_counter() - t0

    t0 = time.perf_counter()
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    shards_dir = ensure_writable_dir(out / "shards")
    written = [write_output_shard(files[i]["stage"], shards_dir, i, copies[offsets[i]:offsets[i + 1]], cfg)
               for i in range(len(files))]
    phase3 = time.perf_counter() - t0

    report = build_report(
        inputs=inputs, cfg=cfg, read_stats=read_stats, stats=stats, dedup=result, cols=cols,
        alive_before_dedup=alive, work=work, counts=counts, plan=plan, written=written, skipped_shards=skipped,
        timing={"curate_shards_s": phase1, "global_s": phase2, "write_s": phase3,
                "total_s": time.perf_counter() - started})
    write_report(out, report)
    return report
