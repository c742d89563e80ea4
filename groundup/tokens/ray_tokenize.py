"""`data tokenize --executor ray`: encoding on a Ray cluster, one task per input file, then one merge.

As datatrove's DocumentTokenizer and DocumentTokenizerMerger: each task (data/input_tasks.py: an input
file, small files grouped to `task_bytes`) encodes its records and leaves, in
`OUT/.work/tasks/NNNNN/`:

    tokens.bin    the documents' tokens in the output dtype, each followed by the end-of-text id
    docs.npz      per document: tokens (end-of-text included), UTF-8 bytes, split score
    docs.jsonl    per document: [id, source, domain, group]
    done.json     written last, the completion marker: counts and what reading saw

The merge, in the driver, reads the tasks' files in input order and hands them to
`writer.write_splits` exactly as the local encoder hands it batches, so `train/`, `val/` and
`index.json` are byte-identical to `--executor local`'s (only `seconds` differs). The merge is a
single pass because the output files are cut at `shard_tokens` in input order and each split is
promised a document; it copies tokens and encodes nothing, a small part of the work.

`.work/manifest.json` names the inputs, the tokenizer and the settings. A relaunch with the same
ones skips every task whose `done.json` exists and redoes the rest; one with other ones removes the
earlier `.work` (only when groundup's tokenize wrote it) and starts again, as a local rerun into the
same directory replaces its output. Once `index.json` is written the `.work` directory goes.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from groundup.data.readers import ReadStats, no_records_error
from groundup.data.input_tasks import InputTask, input_fingerprint, plan_tasks, task_records
from groundup.errors import DataError
from groundup.io import atomic_open, atomic_write_json, ensure_writable_dir, read_json
from groundup.ray_cluster import fault_spec, finished_task, maybe_fault, run_tasks, start_task
from groundup.tokens.writer import encode_documents, text_batches

WORK_DIR = ".work"
WORK_FORMAT = "groundup-tokenize-work"
DONE_FILE = "done.json"
MERGE_DOCS = 65536  # documents per batch handed to the writer: bounds the merge's memory
_tokenizers: dict[str, object] = {}  # per worker process: the run's tokenizer, by its hash


def _tokenizer(refs: list, tok_hash: str):
    if tok_hash not in _tokenizers:
        import ray

        _tokenizers.clear()
        _tokenizers[tok_hash] = ray.get(refs[0])  # sent once per worker, not once per task
    return _tokenizers[tok_hash]


def encode_task(task: InputTask, tok_refs: list, tok_hash: str, cfg, dtype: str, task_dir: str, fault: str | None) -> dict:
    """In a Ray worker: encode one task's records into `task_dir`; returns its marker."""
    directory = Path(task_dir)
    if (marker := start_task(task.files, directory, DONE_FILE)) is not None:
        return marker
    tok = _tokenizer(tok_refs, tok_hash)
    stats, skipped, metas = ReadStats(), collections.Counter(), collections.deque()
    lengths, nbytes, scores = [], [], []
    records = task_records(task, stats, cfg.default_domain)
    with atomic_open(directory / "tokens.bin", "wb") as tokens_file, \
            atomic_open(directory / "docs.jsonl", "w", encoding="utf-8") as meta_file:
        for texts in text_batches(records, cfg, metas, skipped):
            tokens, counts, sizes, split_scores = encode_documents(tok, texts, cfg.seed, dtype)
            tokens_file.write(tokens.tobytes())
            # a group is only ever used as str(group) (its split score, the index's group list)
            meta_file.writelines(json.dumps([rid, source, domain, None if group is None else str(group)],
                                            ensure_ascii=False) + "\n" for rid, source, domain, group in metas.popleft())
            lengths.append(counts)
            nbytes.append(sizes)
            scores.append(split_scores)
            maybe_fault(fault, "tokenize", task.index, directory.parent.parent)
    with atomic_open(directory / "docs.npz", "wb") as f:
        np.savez(f, lengths=np.concatenate(lengths or [np.zeros(0, np.int64)]).astype(np.int64),
                 nbytes=np.concatenate(nbytes or [np.zeros(0, np.int64)]).astype(np.int64),
                 scores=np.concatenate(scores or [np.zeros(0)]).astype(np.float64))
    marker = {"task": task.index, "files": [str(f.path) for f in task.files], "documents": int(sum(map(len, lengths))),
              "skipped_empty": skipped["empty"], "read": stats.to_dict(), "node": platform.node(), "pid": os.getpid(),
              "finished_at": time.time()}
    atomic_write_json(directory / DONE_FILE, marker, indent=None)  # last: the task is complete
    return marker


def _owned(work: Path) -> bool:
    """Whether `work` is a directory this module wrote (and so may remove)."""
    path = work / "manifest.json"
    if not path.is_file():
        return False
    try:
        return read_json(path, expect=dict).get("format") == WORK_FORMAT
    except DataError:
        return False


def _prepare_work(out: Path, manifest: dict) -> Path:
    work = out / WORK_DIR
    if work.exists() and any(work.iterdir()):
        if not _owned(work):
            raise DataError(f"{work}: holds files that groundup's tokenize did not write; choose another --out")
        if read_json(work / "manifest.json") != manifest:
            shutil.rmtree(work)  # encodings of other inputs or settings: of no use to this run
    ensure_writable_dir(work / "tasks")
    atomic_write_json(work / "manifest.json", manifest)
    return work


def discard_work(out: Path) -> None:
    """Remove the tasks' files once the index is written (only a `.work` this module wrote)."""
    work = Path(out) / WORK_DIR
    if _owned(work):
        shutil.rmtree(work)


def _marker(directory: Path, task: InputTask) -> dict | None:
    return finished_task(directory, DONE_FILE, task, f"remove {directory.parent.parent} and run again")


def encode_on_ray(inputs, tok, out: Path, cfg, dtype: np.dtype, stats: ReadStats, skipped: collections.Counter,
                  progress: bool) -> Iterator[tuple]:
    """Run the encoding tasks (connected to Ray already), then return the merge's batches (tokens,
    lengths, bytes, scores, metas) in input order. `stats` and `skipped` are filled at once."""
    import ray

    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "workers"}
    work = _prepare_work(out, {"format": WORK_FORMAT, "inputs": input_fingerprint([Path(p) for p in inputs]),
                               "tokenizer_hash": tok.hash, "dtype": dtype.name, "config": config})
    tasks = plan_tasks(inputs, cfg.task_bytes)
    directories = {t.index: work / "tasks" / t.name for t in tasks}
    markers = {t.index: m for t in tasks if (m := _marker(directories[t.index], t)) is not None}
    pending = [t for t in tasks if t.index not in markers]
    fault = fault_spec()
    refs = [ray.put(tok)] if pending else []
    calls = [(f"tokenize task {t.name} ({t.describe()})", (t, refs, tok.hash, cfg, dtype.str,
                                                           str(directories[t.index]), fault)) for t in pending]
    for task, marker in zip(pending, run_tasks(encode_task, calls, "tokenize tasks", progress)):
        markers[task.index] = marker
    for task in tasks:
        stats.merge(ReadStats(**markers[task.index]["read"]))
        skipped["empty"] += markers[task.index]["skipped_empty"]
    if stats.records == 0:
        raise no_records_error(inputs, stats)
    return _merged([directories[t.index] for t in tasks], dtype)


def _merged(directories: list[Path], dtype: np.dtype) -> Iterator[tuple]:
    for directory in directories:
        with np.load(directory / "docs.npz") as data:
            lengths, nbytes, scores = data["lengths"], data["nbytes"], data["scores"]
        if not len(lengths):
            continue
        tokens = np.memmap(directory / "tokens.bin", dtype=dtype, mode="r")
        starts = np.concatenate(([0], np.cumsum(lengths)))
        with open(directory / "docs.jsonl", encoding="utf-8") as meta_file:
            for c0 in range(0, len(lengths), MERGE_DOCS):
                c1 = min(c0 + MERGE_DOCS, len(lengths))
                metas = [tuple(json.loads(meta_file.readline())) for _ in range(c1 - c0)]
                yield tokens[starts[c0]:starts[c1]], lengths[c0:c1], nbytes[c0:c1], scores[c0:c1], metas
