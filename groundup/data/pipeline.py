"""`curate`: the whole curation run, in three phases over shards of records.

1. The inputs are planned as tasks (data/input_tasks.py: one per input file, small files grouped), each
   task's records are cut into shards (`output.shard_docs` / `shard_bytes`) and each shard is
   curated on its own (`curate_shard`), leaving its survivors, dedup hashes and counters in
   `OUT/.work/`. A shard already complete there is skipped.
2. Global decisions over all shards: top-fraction classifier cut, decontamination against eval
   tasks (`decontaminate.tasks`, data/decontaminate.py), exact and MinHash (or SimHash: `dedup.near`)
   dedup (`dedup`, bounded memory), exact substring dedup (`dedup.substring`, data/substring_dedup.py: cuts
   written as `OUT/.work/substr-NNNNN.npy`, computed here for both executors) and the mixing plan (`mixing`).
3. Each work shard becomes `OUT/shards/part-NNNNN.parquet` (or `.jsonl`): duplicates dropped, repeated spans cut,
   documents repeated or dropped by the mixing plan, rows shuffled; existing parts are kept.
Then `report.json` and `report.md` (see `report`).

Where the work runs is the executor's business, and only speed depends on it: `LocalExecutor`
(below: shards in `workers` processes, dedup and output in this process) or `RayExecutor`
(data/ray_curate.py: one Ray task per input task, the dedup stages and the output shards as Ray
tasks, anywhere on a cluster). Both run the same code on the same shards, so they write the same
bytes; the classifier cut, decontamination, the mixing plan and the report are computed here in
both cases, from the shards' small per-document columns.

A restart is only safe with the same inputs and settings, so `.work/manifest.json` records them
and a different run into the same directory stops with the differences listed. One process
writes a run at a time (`OUT/.lock`, io.writer_lock).
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import multiprocessing
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow.parquet as pq

from groundup.config import config_diff, save_config
from groundup.data.curate_config import CurateConfig, fingerprint_dict
from groundup.data.curate_shard import ShardCurator, shard_complete, shard_files
from groundup.data.decontaminate import decontaminate_stage
from groundup.data.dedup import DedupResult, deduplicate, shard_offsets
from groundup.data.mixing import assign_copies, plan_mix
from groundup.data.output import write_output_shard
from groundup.data.ray_curate import RayExecutor
from groundup.data.readers import ReadStats, check_inputs, no_records_error
from groundup.data.curation_report import build_report, write_report
from groundup.data.stats import StageStats
from groundup.data.substring_dedup import record_stage, removal_path, substring_dedup
from groundup.data.input_tasks import InputTask, cut_shards, input_fingerprint, plan_tasks, task_records
from groundup.errors import DataError
from groundup.io import atomic_write_json, ensure_writable_dir, read_json, writer_lock
from groundup.layout import mark_output_dir

EXECUTORS = ("local", "ray")

_curator: ShardCurator | None = None  # one per worker process


def _init_worker(cfg: CurateConfig, scorer: Callable | None) -> None:
    global _curator
    _curator = ShardCurator(cfg, scorer)


def _run_shard(index: int, records: list[dict], work: Path) -> dict:
    return _curator(index, records, work)


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


def _local_shards(tasks: Sequence[InputTask], cfg: CurateConfig, read_stats: ReadStats) -> Iterator[tuple[int, list[dict]]]:
    """Every task's shards, read here one task after the other, numbered across tasks."""
    index = 0
    for task in tasks:
        records = task_records(task, read_stats, cfg.read.default_domain, cfg.read.max_record_bytes,
                           raw_html=True, max_page_bytes=cfg.read.max_page_bytes)
        for _, batch in cut_shards(records, cfg.output.shard_docs, cfg.output.shard_bytes):
            yield index, batch
            index += 1


def _curate_shards(tasks: Sequence[InputTask], cfg: CurateConfig, work: Path, read_stats: ReadStats,
                   progress: bool, scorer: Callable | None = None) -> tuple[list[dict], int]:
    """Phase 1. Returns every shard's stats (in order) and how many were skipped as complete."""
    from tqdm import tqdm

    results: dict[int, dict] = {}
    skipped = 0
    bar = tqdm(desc="curate", unit=" docs", disable=not progress)
    if cfg.workers == 1:
        curator = ShardCurator(cfg, scorer)
        for index, batch in _local_shards(tasks, cfg, read_stats):
            if shard_complete(work, index):
                results[index], skipped = read_json(shard_files(work, index)["stats"]), skipped + 1
            else:
                results[index] = curator(index, batch, work)
            bar.update(len(batch))
    else:
        # spawn, not fork: pyarrow's thread pools do not survive a fork.
        context = multiprocessing.get_context("spawn")
        with futures.ProcessPoolExecutor(cfg.workers, mp_context=context, initializer=_init_worker,
                                         initargs=(cfg, scorer)) as pool:
            pending: dict[futures.Future, int] = {}
            for index, batch in _local_shards(tasks, cfg, read_stats):
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


def _load_columns(files: Sequence[dict[str, Path]]) -> dict[str, np.ndarray]:
    """domain and source (as codes), bytes and classifier score of every surviving document."""
    parts: dict[str, list] = {"domain": [], "source": [], "nbytes": [], "quality": []}
    for shard in files:
        table = pq.read_table(shard["stage"], columns=list(parts))
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


class LocalExecutor:
    """Shards curated in `cfg.workers` processes of this machine; dedup and output in this process."""

    def __init__(self, cfg: CurateConfig, work: Path, progress: bool, scorer: Callable | None = None):
        self.cfg, self.work, self.progress, self.scorer = cfg, work, progress, scorer

    def curate_shards(self, tasks: Sequence[InputTask], read_stats: ReadStats) -> tuple[list[dict], list[dict], int]:
        """Every shard's stats and files (in order), and how many shards were complete already."""
        results, skipped = _curate_shards(tasks, self.cfg, self.work, read_stats, self.progress, self.scorer)
        return results, [shard_files(self.work, i) for i in range(len(results))], skipped

    def deduplicate(self, files: Sequence[dict], counts: Sequence[int], alive: np.ndarray,
                    eligible: np.ndarray) -> DedupResult:
        d = self.cfg.dedup
        return deduplicate([f["exact"] for f in files], [f["bands"] for f in files], counts, alive, eligible,
                           d.exact.enabled, d.near_config().enabled, d.minhash.bands, d.near_config().memory_mb,
                           d.simhash.k if d.near == "simhash" else None)

    def write_outputs(self, files: Sequence[dict], shards_dir: Path, copies: Sequence[np.ndarray],
                      removals: Sequence[Path | None]) -> list[dict]:
        return [write_output_shard(f["stage"], shards_dir, i, c, self.cfg, r)
                for i, (f, c, r) in enumerate(zip(files, copies, removals))]


@contextlib.contextmanager
def open_executor(executor: str, address: str | None, cfg: CurateConfig, work: Path, progress: bool,
                  scorer: Callable | None = None):
    if executor == "local":
        if address:
            raise DataError(f"--address {address}: only --executor ray connects to a cluster")
        yield LocalExecutor(cfg, work, progress, scorer)
    elif executor == "ray":
        with RayExecutor.connect(address, cfg, work, progress, scorer) as ray_executor:
            yield ray_executor
    else:
        raise DataError(f"executor {executor!r}: expected one of {', '.join(EXECUTORS)}")


def curate(inputs: Sequence[str | Path], out: str | Path, cfg: CurateConfig, progress: bool = True,
           executor: str = "local", address: str | None = None, checkpoint_scorer: Callable | None = None) -> dict:
    """Run the whole curation into `out`; returns the report (also written as report.json/.md).

    `executor="ray"` runs the tasks on the Ray cluster at `address` ("auto", "HOST:PORT",
    "ray://HOST:PORT"; None: a Ray instance started for this run on this machine)."""
    started = time.perf_counter()
    inputs = [Path(p) for p in inputs]
    check_inputs(inputs)
    out = Path(out)
    with open_executor(executor, address, cfg, out / ".work", progress, checkpoint_scorer) as ex:
        out = mark_output_dir(out, "data curate")  # only now: a run that cannot start leaves no folder
        with writer_lock(out):
            work = ensure_writable_dir(out / ".work")
            _check_manifest(work, {"inputs": input_fingerprint(inputs), "config": fingerprint_dict(cfg)})
            save_config(cfg, out / "config.toml")
            return _run(ex, inputs, out, cfg, work, started)


def _run(ex, inputs: list[Path], out: Path, cfg: CurateConfig, work: Path, started: float) -> dict:
    read_stats = ReadStats()
    shard_results, files, skipped = ex.curate_shards(plan_tasks(inputs, cfg.read.task_bytes), read_stats)
    if read_stats.records == 0:
        raise no_records_error(inputs, read_stats)
    phase1 = time.perf_counter() - started

    t0 = time.perf_counter()
    stats = StageStats(cfg.output.examples, cfg.output.snippet_chars)
    for result in shard_results:
        stats.merge_dict(result["stages"])
    counts = [r["kept"] for r in shard_results]
    cols = _load_columns(files)
    alive = np.ones(len(cols["domain"]), dtype=bool)
    if cfg.classifier.model and cfg.classifier.top_fraction is not None:
        keep = _top_fraction(cfg, cols, alive)
        _bulk_stage(stats, "classifier_top_fraction", cols, alive, keep, "below_top_fraction")
        alive = keep
    if cfg.decontaminate.tasks:  # documents sharing a 13-gram with an eval item (data/decontaminate.py)

        t1 = time.perf_counter()
        keep = decontaminate_stage(cfg.decontaminate, [f["stage"] for f in files], counts, alive, stats)
        _bulk_stage(stats, "decontaminate", cols, alive, keep, "overlaps_eval_item")
        stats.add_time("decontaminate", time.perf_counter() - t1)
        alive = keep
    eligible = np.isin(cols["domain"], cfg.dedup.near_config().domains)
    result = ex.deduplicate(files, counts, alive, eligible)
    after_exact = alive & ~result.exact_duplicate
    if cfg.dedup.exact.enabled:
        _bulk_stage(stats, "exact_dedup", cols, alive, after_exact, "duplicate_text")
    after_near = after_exact & ~result.near_duplicate
    near_stage = f"{cfg.dedup.near}_dedup"  # minhash_dedup or simhash_dedup: the report names the method
    if cfg.dedup.near_config().enabled:
        _bulk_stage(stats, near_stage, cols, after_exact & eligible, after_near & eligible, "near_duplicate")
    stats.add_time(near_stage, time.perf_counter() - t0)  # the global pass: bucketing, union-find
    substring = None
    if cfg.dedup.substring.enabled:  # spans repeated anywhere cut from the survivors (data/substring_dedup.py)
        t1 = time.perf_counter()
        considered = after_near & np.isin(cols["domain"], cfg.dedup.substring.domains)
        substring = substring_dedup(cfg.dedup.substring, [f["stage"] for f in files], counts, considered,
                                    cols["nbytes"], work)
        record_stage(stats, cols, considered, substring)
        stats.add_time("substring_dedup", time.perf_counter() - t1)
        after_near = after_near & ~substring.emptied
        cols["nbytes"] = cols["nbytes"] - substring.removed_bytes  # from here on: sizes after the cuts
    available = {str(d): int(cols["nbytes"][after_near & (cols["domain"] == d)].sum())
                 for d in np.unique(cols["domain"][after_near])} if after_near.any() else {}
    plan = plan_mix(available, cfg.mixing)
    copies = assign_copies(plan, cols["domain"], cols["nbytes"], after_near, cfg.seed, cfg.mixing.max_repeats)
    phase2 = time.perf_counter() - t0

    t0 = time.perf_counter()
    offsets = shard_offsets(counts)
    written = ex.write_outputs(files, ensure_writable_dir(out / "shards"),
                               [copies[offsets[i]:offsets[i + 1]] for i in range(len(files))],
                               [removal_path(work, i) if substring else None for i in range(len(files))])
    phase3 = time.perf_counter() - t0

    report = build_report(
        inputs=inputs, cfg=cfg, read_stats=read_stats, stats=stats, dedup=result, cols=cols,
        alive_before_dedup=alive, stage_files=[f["stage"] for f in files], counts=counts, plan=plan,
        written=written, skipped_shards=skipped, substring=substring,
        timing={"curate_shards_s": phase1, "global_s": phase2, "write_s": phase3,
                "total_s": time.perf_counter() - started})
    write_report(out, report)
    return report
