"""`data curate --executor ray`: curation's tasks on a Ray cluster, datatrove's way.

The run is the one `pipeline.curate` describes, with the work that grows with the corpus spread
over the cluster:

| stage | Ray tasks | datatrove |
| --- | --- | --- |
| read, filter, redact, hash (MinHash signatures and band keys) | one per input task (data/input_tasks.py) | reader + filters + MinhashDedupSignature, one task per input file |
| exact duplicates | one per key bucket | (an exact-dedup stage of its own) |
| MinHash band buckets | one per band and key bucket | MinhashDedupBuckets |
| clusters | one union-find task | MinhashDedupCluster |
| output shards (duplicates dropped, mix applied) | one per shard | MinhashDedupFilter + writer |

The driver (the process running `groundup data curate`) only plans, waits and decides what needs
every document at once: the classifier's top-fraction cut, decontamination, the mixing plan and
the report, from each document's domain, source, size and score (a few bytes per document).

Completion markers: an input task writes its shards in `OUT/.work/tasks/NNNNN/` (the same files
as a local run's shards: stage-PPPPP.parquet, exact-, bands-, stats-) and `done.json` last, with
the shards' counters and what reading saw; a dedup task's result file and an output part are
their own markers (written under a temporary name and renamed). A relaunch with the same inputs
and settings skips every task whose marker exists, and within an unfinished input task it skips
the shards already complete; nothing finished runs again, and nothing half-written is read.
Shards are numbered in task order, so the output is byte-identical to `--executor local`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from groundup.data.curate_config import CurateConfig
from groundup.data.curate_shard import ShardCurator, shard_complete, shard_files
from groundup.data.dedup import DedupResult
from groundup.data.output import write_output_shard
from groundup.data.ray_dedup import ray_deduplicate
from groundup.data.readers import ReadStats
from groundup.data.input_tasks import InputTask, cut_shards, task_records
from groundup.io import atomic_write_json, read_json
from groundup.ray_cluster import (fault_spec, finished_task, maybe_fault, ray_session, remove_temporaries,
                                  require_shared, run_tasks, start_task)

DONE_FILE = "done.json"
_curator: tuple[str, ShardCurator] | None = None  # per worker process: built once per configuration


def _shard_curator(cfg: CurateConfig, scorer: Callable | None) -> ShardCurator:
    global _curator
    key = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
    if _curator is None or _curator[0] != key:
        _curator = (key, ShardCurator(cfg, scorer))
    return _curator[1]


def curate_task(task: InputTask, cfg: CurateConfig, task_dir: str, fault: str | None,
                scorer: Callable | None = None) -> dict:
    """In a Ray worker: curate one input task's shards into `task_dir`; returns its marker."""
    directory = Path(task_dir)
    if (marker := start_task(task.files, directory, DONE_FILE)) is not None:
        return marker
    curator = _shard_curator(cfg, scorer)
    stats = ReadStats()
    shards = []
    records = task_records(task, stats, cfg.read.default_domain, cfg.read.max_record_bytes,
                           raw_html=True, max_page_bytes=cfg.read.max_page_bytes)
    for part, batch in cut_shards(records, cfg.output.shard_docs, cfg.output.shard_bytes):
        if shard_complete(directory, part):
            shards.append(read_json(shard_files(directory, part)["stats"], expect=dict))
        else:
            shards.append(curator(part, batch, directory))
        maybe_fault(fault, "curate", task.index, directory.parent.parent)
    marker = {"task": task.index, "files": [str(f.path) for f in task.files], "shards": shards,
              "read": stats.to_dict(), "node": platform.node(), "pid": os.getpid(), "finished_at": time.time()}
    atomic_write_json(directory / DONE_FILE, marker, indent=None)  # last: the task is complete
    return marker


def write_task(stage: str, shards_dir: str, index: int, copies: np.ndarray, cfg: CurateConfig, work: str,
               fault: str | None, removals: str | None = None) -> dict:
    """In a Ray worker: one output part (an existing part is kept and only counted)."""
    require_shared(shards_dir)
    remove_temporaries(Path(shards_dir), f"part-{index:05d}.*")
    maybe_fault(fault, "write", index, Path(work))
    return write_output_shard(Path(stage), Path(shards_dir), index, copies, cfg, removals and Path(removals))


class RayExecutor:
    """`pipeline.curate`'s executor interface (see LocalExecutor there), on a Ray cluster."""

    def __init__(self, cfg: CurateConfig, work: Path, progress: bool, scorer: Callable | None = None):
        self.cfg, self.work, self.progress, self.scorer = cfg, work, progress, scorer
        self.fault = fault_spec()

    @classmethod
    @contextlib.contextmanager
    def connect(cls, address: str | None, cfg: CurateConfig, work: Path, progress: bool,
                scorer: Callable | None = None) -> Iterator["RayExecutor"]:
        with ray_session(address):
            yield cls(cfg, work, progress, scorer)

    def _task_dir(self, task: InputTask) -> Path:
        return self.work / "tasks" / task.name

    def _marker(self, task: InputTask) -> dict | None:
        return finished_task(self._task_dir(task), DONE_FILE, task, "use a new --out directory")

    def curate_shards(self, tasks: Sequence[InputTask], read_stats: ReadStats) -> tuple[list[dict], list[dict], int]:
        import ray

        (self.work / "tasks").mkdir(parents=True, exist_ok=True)
        markers = {t.index: m for t in tasks if (m := self._marker(t)) is not None}
        skipped = sum(len(m["shards"]) for m in markers.values())
        pending = [t for t in tasks if t.index not in markers]
        cfg_ref = ray.put(self.cfg)
        calls = [(f"curate task {t.name} ({t.describe()})", (t, cfg_ref, str(self._task_dir(t)), self.fault, self.scorer))
                 for t in pending]
        for task, marker in zip(pending, run_tasks(curate_task, calls, "curate tasks", self.progress)):
            markers[task.index] = marker
        results, files = [], []
        for task in tasks:
            marker = markers[task.index]
            read_stats.merge(ReadStats(**marker["read"]))
            for part, shard in enumerate(marker["shards"]):
                results.append(shard)
                files.append(shard_files(self._task_dir(task), part))
        return results, files, skipped

    def deduplicate(self, files: Sequence[dict], counts: Sequence[int], alive: np.ndarray,
                    eligible: np.ndarray) -> DedupResult:
        return ray_deduplicate(files, counts, alive, eligible, self.cfg, self.work, self.progress, self.fault)

    def write_outputs(self, files: Sequence[dict], shards_dir: Path, copies: Sequence[np.ndarray],
                      removals: Sequence[Path | None]) -> list[dict]:
        import ray

        cfg_ref = ray.put(self.cfg)
        calls = [(f"output shard {i:05d}", (str(f["stage"]), str(shards_dir), i, c, cfg_ref, str(self.work), self.fault,
                                            r and str(r))) for i, (f, c, r) in enumerate(zip(files, copies, removals))]
        return run_tasks(write_task, calls, "output shards", self.progress)
