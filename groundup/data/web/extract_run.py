"""`groundup data extract`: one text record per HTML page of a crawl, without any filtering.

    extract(["crawl/"], "pages.jsonl", ExtractConfig())     # one file, renamed into place when complete
    extract(["crawl/"], "pages/", ExtractConfig(), workers=2)  # pages/<crawl file>.jsonl each, + report.json

Each record: `id` (the WARC record id), `url`, `text`, `title`, `language` and `language_score`
(fastText lid.176), `warc` (record_id, date, file, offset, charset). A page without main content
writes no record; it is counted. Into a folder, each crawl file's records are written under a
temporary name and renamed when the file is done, so a rerun after a crash or Ctrl-C skips the
files already written and redoes only the rest; one bad record never stops a file (web/warc.py
counts it with file and offset).
"""

from __future__ import annotations

import concurrent.futures as futures
import json
import multiprocessing
import time
from pathlib import Path
from typing import IO, Sequence

from groundup.data.readers import iter_input_files
from groundup.data.web.extract import ExtractConfig
from groundup.data.web.records import RecordExtractor, iter_crawl_records
from groundup.data.web.warc import WarcStats, is_crawl_file
from groundup.errors import DataError
from groundup.io import atomic_open, atomic_write_json, ensure_writable_dir, read_json, writer_lock
from groundup.layout import mark_output_dir

RECORD_FIELDS = ("id", "url", "text", "title", "language", "language_score", "warc")

_extractor: RecordExtractor | None = None  # one per process: models load once


def _counts() -> dict:
    return {"pages": 0, "records": 0, "no_main_content": 0, "html_bytes": 0, "text_bytes": 0, "languages": {}}


def _merge_counts(total: dict, part: dict) -> None:
    for key, value in part.items():
        if key == "languages":
            for lang, n in value.items():
                total["languages"][lang] = total["languages"].get(lang, 0) + n
        else:
            total[key] += value


def _extract_file(path: Path, cfg: ExtractConfig, max_page_bytes: int, f: IO[str]) -> tuple[dict, WarcStats]:
    global _extractor
    if _extractor is None or _extractor.cfg != cfg:
        _extractor = RecordExtractor(cfg)
    _extractor.reset()  # per file, whichever worker extracts it
    counts, warc = _counts(), WarcStats()
    for raw in iter_crawl_records(path, path.name, "text", warc, max_page_bytes):
        counts["pages"] += 1
        counts["html_bytes"] += len(raw["text"].encode("utf-8", "surrogatepass"))
        record = _extractor(raw)
        if record is None:
            counts["no_main_content"] += 1
            continue
        counts["records"] += 1
        counts["text_bytes"] += len(record["text"].encode("utf-8", "surrogatepass"))
        counts["languages"][record["language"]] = counts["languages"].get(record["language"], 0) + 1
        f.write(json.dumps({k: record.get(k) for k in RECORD_FIELDS}, ensure_ascii=False) + "\n")
    return counts, warc


def _extract_to_file(path: Path, out: Path, cfg: ExtractConfig, max_page_bytes: int) -> dict:
    """One crawl file into `out` (written whole or not at all); its counts and read problems."""
    with atomic_open(out, "w", encoding="utf-8") as f:
        counts, warc = _extract_file(path, cfg, max_page_bytes, f)
    return {"file": str(path), "out": out.name, "counts": counts, "read": warc.to_dict()}


def output_name(path: Path) -> str:
    """`CC-MAIN-x.warc.gz` -> `CC-MAIN-x.jsonl`: one output per crawl file, named after it."""
    name = path.name
    for suffix in (".gz", ".wet", ".warc", ".arc"):  # in this order: x.warc.wet.gz -> x
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name + ".jsonl"


def crawl_files(inputs: Sequence[Path]) -> tuple[list[Path], list[str]]:
    """The crawl files the inputs name (directories walked), and the other files, which are not read."""
    files, other = [], []
    for file in iter_input_files(inputs):
        if file.in_directory and file.path.name.startswith("."):
            continue  # markers, locks, reports of earlier runs
        (files if is_crawl_file(file.path) else other).append(file.path)
    if not files:
        raise DataError(f"no crawl file (.warc, .warc.gz, .arc, .arc.gz, .wet, .wet.gz) in "
                        f"{', '.join(map(str, inputs))}")
    names = [output_name(p) for p in files]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise DataError(f"two crawl files would both be written as {twice}: extract them into separate folders")
    return files, [str(p) for p in other]


def extract(inputs: Sequence[str | Path], out: str | Path, cfg: ExtractConfig, workers: int = 1,
            max_page_bytes: int = 8 << 20, progress: bool = True) -> dict:
    """Extract every page of the crawl files in `inputs` into `out` (a .jsonl file or a folder); returns the
    summary (also `report.json` in a folder)."""
    from tqdm import tqdm

    started = time.perf_counter()
    cfg.validate()
    inputs = [Path(p) for p in inputs]
    for p in inputs:
        if not p.exists():
            raise DataError(f"input not found: {p}")
    files, skipped_other = crawl_files(inputs)
    out = Path(out)
    to_file = out.suffix == ".jsonl"
    results: list[dict] = []
    if to_file:
        ensure_writable_dir(out.parent)
        with atomic_open(out, "w", encoding="utf-8") as f:
            for path in tqdm(files, desc="extract", unit=" files", disable=not progress):
                counts, warc = _extract_file(path, cfg, max_page_bytes, f)
                results.append({"file": str(path), "out": out.name, "counts": counts, "read": warc.to_dict()})
        reused = 0
    else:
        out = mark_output_dir(out, "data extract")
        with writer_lock(out):
            results, reused = _extract_to_dir(files, out, cfg, workers, max_page_bytes, progress)
    summary = _summary(results, skipped_other, reused, time.perf_counter() - started)
    if not to_file:
        atomic_write_json(out / "report.json", summary)
    return summary


def _extract_to_dir(files: list[Path], out: Path, cfg: ExtractConfig, workers: int, max_page_bytes: int,
                    progress: bool) -> tuple[list[dict], int]:
    from tqdm import tqdm

    done_dir = ensure_writable_dir(out / ".done")  # one small JSON per finished file: its counts
    results: dict[int, dict] = {}
    todo = []
    for i, path in enumerate(files):
        marker = done_dir / (output_name(path) + ".json")
        if marker.exists() and (out / output_name(path)).exists():
            results[i] = read_json(marker)
        else:
            todo.append(i)
    reused = len(results)
    bar = tqdm(total=len(files), initial=reused, desc="extract", unit=" files", disable=not progress)

    def finish(i: int, result: dict) -> None:
        atomic_write_json(done_dir / (output_name(files[i]) + ".json"), result)
        results[i] = result
        bar.update(1)

    if workers <= 1 or len(todo) <= 1:
        for i in todo:
            finish(i, _extract_to_file(files[i], out / output_name(files[i]), cfg, max_page_bytes))
    else:
        # spawn, not fork: the HTML parsers' and pyarrow's threads do not survive a fork.
        with futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            pending = {pool.submit(_extract_to_file, files[i], out / output_name(files[i]), cfg, max_page_bytes): i
                       for i in todo}
            for f in futures.as_completed(pending):
                finish(pending[f], f.result())
    bar.close()
    return [results[i] for i in sorted(results)], reused


def _summary(results: list[dict], skipped_other: list[str], reused: int, seconds: float) -> dict:
    counts, warc = _counts(), WarcStats()
    for r in results:
        _merge_counts(counts, r["counts"])
        warc.merge(WarcStats.from_dict(r["read"]))
    return {
        "files": len(results), "files_reused": reused, "not_crawl_files": skipped_other[:20],
        "not_crawl_file_count": len(skipped_other), **counts, "read": warc.to_dict(), "seconds": round(seconds, 3),
        "pages_per_s": round(counts["pages"] / seconds, 1) if seconds > 0 else None,
        "mb_per_s": round(counts["html_bytes"] / 1e6 / seconds, 2) if seconds > 0 else None,
        "per_file": [{"file": r["file"], "out": r["out"], **{k: r["counts"][k] for k in ("pages", "records")}}
                     for r in results],
    }
