"""Cutting a data run into tasks: the unit `data curate` and `data tokenize` distribute.

A task is a run of consecutive input files, in reading order, that holds at least `task_bytes`
bytes on disk: a file of that size or more is a task of its own (datatrove's "one task per input
file"), and small files (a source tree's) are grouped with their neighbours so that no task is a
few kilobytes of work with a scheduling cost of its own.

Curation cuts each task's records into shards of `output.shard_docs` documents or
`output.shard_bytes` bytes of text, starting a new shard at each task's first record. Whether the
tasks are read one after the other on this machine (`--executor local`, which sends the shards to
worker processes) or each in a Ray task on any machine of a cluster (`--executor ray`), the same
records form the same shards under the same numbers, so both write the same output.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from groundup.data.readers import InputFile, ReadStats, iter_input_files, read_input_file


@dataclasses.dataclass(frozen=True)
class InputTask:
    index: int
    files: tuple[InputFile, ...]
    bytes: int  # on disk, compressed or not

    @property
    def name(self) -> str:
        return f"{self.index:05d}"

    def describe(self) -> str:
        """The task's files for messages: the first one's path, and how many more."""
        more = f" and {len(self.files) - 1} more files" if len(self.files) > 1 else ""
        return f"{self.files[0].path}{more}"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # unreadable: the reader counts it when the task reads it
        return 0


def plan_tasks(paths: Sequence[str | Path], task_bytes: int) -> list[InputTask]:
    """Every input file in reading order, grouped into tasks of at least `task_bytes` bytes on disk."""
    tasks: list[InputTask] = []
    group: list[InputFile] = []
    size = 0
    for file in iter_input_files(paths):
        group.append(file)
        size += _size(file.path)
        if size >= task_bytes:
            tasks.append(InputTask(len(tasks), tuple(group), size))
            group, size = [], 0
    if group:
        tasks.append(InputTask(len(tasks), tuple(group), size))
    return tasks


def task_records(task: InputTask, stats: ReadStats, default_domain: str | None = None,
                 max_record_bytes: int = 64 << 20, raw_html: bool = False, max_page_bytes: int = 8 << 20) -> Iterator[dict]:
    """The records of a task's files, in order; problems are counted in `stats`. `raw_html`: crawl pages
    keep their HTML for the curator to extract (data/web/records.py)."""
    for file in task.files:
        yield from read_input_file(file, stats, default_domain, max_record_bytes, raw_html=raw_html,
                                   max_page_bytes=max_page_bytes)


def cut_shards(records: Iterable[dict], max_docs: int, max_bytes: int) -> Iterator[tuple[int, list[dict]]]:
    """Consecutive records in shards of at most `max_docs` documents or about `max_bytes` of text,
    numbered from 0."""
    batch, size, index = [], 0, 0
    for record in records:
        batch.append(record)
        size += len(record["text"])
        if len(batch) >= max_docs or size >= max_bytes:
            yield index, batch
            batch, size, index = [], 0, index + 1
    if batch:
        yield index, batch


def input_fingerprint(paths: Sequence[Path]) -> list[dict]:
    """Path, file count, bytes and newest modification time of each input: what a restarted run
    compares to know that it reads the same data as the run it continues."""
    out = []
    for p in paths:
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        out.append({"path": str(p.resolve()), "files": len(files),
                    "bytes": sum(f.stat().st_size for f in files),
                    "mtime": max((f.stat().st_mtime for f in files), default=0.0)})
    return out
