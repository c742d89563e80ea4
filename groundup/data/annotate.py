"""`groundup data annotate`: score a sample of documents with an LLM judge, then train the quality classifier.

FineWeb-Edu's recipe on any OpenAI-compatible endpoint (a `groundup serve` model, vLLM, a hosted API):

    OUT/
        settings.json       what defines the annotations (inputs, model, rubric hash, seed, ...): a rerun must match
        rubric.txt          the prompt sent, with {document} where each document goes
        annotations.jsonl   one line per annotated document: id, source, url, status (scored | unparsable), score,
                            reasons, answer, model, attempts, error, text (the head that was sent), truncated
        classifier.npz      the quality classifier (classifier.py) trained on the scored annotations: the file
                            `data curate` takes as classifier.model; it predicts P(score >= threshold)
        report.json, report.md  counts of this run and of the folder, the score histogram, the classifier's
                            agreement with the held-out annotations

The promises:
- The sample is the `sample` documents with the smallest seeded hash of (source, id): the same for a seed
  whatever the input order, and a larger sample holds a smaller one, so a rerun with a larger --sample only
  annotates the new documents.
- Each annotation is appended with flush + fsync, so a kill loses at most the line in flight; a rerun (or
  --resume) skips every document already annotated and drops (and counts) a torn last line. No document is
  annotated twice. A document whose requests all failed is not written: the next run tries it again.
- The held-out set is chosen by a second seeded hash of (source, id), so it does not move as the sample grows.
- The API key is read from the environment variable `api_key_env` and is written nowhere.
"""

from __future__ import annotations

import heapq
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence
from urllib.parse import urlsplit, urlunsplit

from tqdm import tqdm

from groundup.config import fail
from groundup.data.annotate_client import DEFAULT_RUBRIC, DEFAULT_VERDICT, AnnotationClient, check_rubric
from groundup.data.annotate_report import RunCounts, evaluate_classifier, write_report
from groundup.data.classifier import FeatureSpec, train
from groundup.data.hashing import split_score
from groundup.data.readers import ReadStats, iter_records
from groundup.errors import ConfigError, DataError
from groundup.io import (atomic_write_json, atomic_write_text, naming_full_disk, read_json, read_text, sha256_bytes,
                         writer_lock, writing)

ANNOTATIONS_FILE = "annotations.jsonl"
SETTINGS_FILE = "settings.json"
RUBRIC_FILE = "rubric.txt"
CLASSIFIER_FILE = "classifier.npz"
SETTINGS_FORMAT = "groundup-annotations-1"
# What defines the annotations: a rerun into the same folder must keep these (sample may only grow).
FIXED_SETTINGS = ("input", "model", "rubric_sha256", "verdict", "seed", "max_chars", "temperature", "max_tokens")


@dataclass
class AnnotateConfig:
    endpoint: str = ""  # base URL of an OpenAI-compatible API, e.g. http://localhost:8000/v1 (/v1 added if no path)
    model: str = ""  # the model name sent with each request
    rubric: str | None = None  # a prompt file holding {document} once and the verdict line; none: the built-in
    verdict: str = DEFAULT_VERDICT  # the answer's last line must be "<verdict>: N", N from 0 to 5
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the API key; unset: no key is sent
    sample: int = 1000  # documents to annotate (all of them when the inputs hold fewer); may grow on a rerun
    seed: int = 0  # picks the sample and the held-out set
    max_chars: int = 10_000  # the head of each document that is sent (and trained on); 0: the whole document
    temperature: float = 0.0  # sampling temperature of the judge; 0: greedy
    max_tokens: int = 512  # the longest answer asked for
    concurrency: int = 8  # requests in flight at once
    rate: float = 0.0  # requests per second, all threads together; 0: no limit
    max_retries: int = 3  # further attempts after a timeout, a 408/409/429/5xx or a malformed answer; 0: none
    timeout: float = 60.0  # seconds to wait for one answer
    backoff: float = 1.0  # seconds before the first retry, doubled for each next one (a Retry-After header wins)
    max_consecutive_failures: int = 20  # stop the run when this many documents in a row fail; 0: never stop
    threshold: int = 3  # a score at or above this is "good": the classifier's positive class (FineWeb-Edu: 3)
    held_out: float = 0.2  # fraction of scored documents kept out of training to measure agreement; 0: none
    epochs: int = 8  # classifier training epochs
    bits: int = 20  # 2^bits hashed feature buckets of the classifier

    def validate(self) -> None:
        if not urlsplit(self.endpoint).scheme in ("http", "https") or not urlsplit(self.endpoint).netloc:
            fail("endpoint", self.endpoint, "an http:// or https:// URL such as http://localhost:8000/v1")
        if not self.model.strip():
            fail("model", self.model, "the model name the endpoint serves")
        if not self.verdict.strip():
            fail("verdict", self.verdict, "a label such as 'Educational score'")
        for key, low in (("sample", 1), ("seed", 0), ("concurrency", 1), ("max_tokens", 1), ("max_chars", 0), ("max_retries", 0),
                         ("max_consecutive_failures", 0), ("epochs", 1)):
            if getattr(self, key) < low:
                fail(key, getattr(self, key), f"an integer of at least {low}")
        for key in ("rate", "temperature", "backoff"):
            if getattr(self, key) < 0:
                fail(key, getattr(self, key), "a number of at least 0")
        if not self.timeout > 0:
            fail("timeout", self.timeout, "seconds, more than 0")
        if not 1 <= self.threshold <= 5:
            fail("threshold", self.threshold, "a score from 1 to 5")
        if not 0 <= self.held_out < 1:
            fail("held_out", self.held_out, "a fraction in [0, 1)")
        if not 8 <= self.bits <= 26:
            fail("bits", self.bits, "an integer from 8 to 26")


@dataclass
class Document:
    key: str  # "source\0id": what identifies a document across runs
    id: str
    source: str
    text: str  # the head that is sent, at most max_chars characters
    truncated: bool
    url: str | None
    held_out: bool


def base_url(endpoint: str) -> str:
    """The endpoint as the openai client wants it: `/v1` added to a bare host."""
    parts = urlsplit(endpoint)
    return endpoint if parts.path.strip("/") else urlunsplit(parts._replace(path="/v1"))


def shown_url(endpoint: str) -> str:
    """The endpoint without user:password@, query or fragment: what may be written to a report."""
    parts = urlsplit(endpoint)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def load_rubric(cfg: AnnotateConfig) -> str:
    rubric = DEFAULT_RUBRIC if cfg.rubric is None else read_text(cfg.rubric, ConfigError)
    why = check_rubric(rubric, cfg.verdict)
    if why:
        fail("rubric", cfg.rubric or "(built-in)", f"a prompt file usable as a rubric: {why}")
    return rubric


def draw_sample(inputs: Sequence[str | Path], cfg: AnnotateConfig, stats: ReadStats, counts: RunCounts,
                progress: bool = False) -> list[Document]:
    """The `cfg.sample` non-empty documents with the smallest seeded hash of (source, id), in that order."""
    heap: list[tuple[float, str, dict]] = []  # (-rank, key, record): the largest rank on top, to be evicted
    inside: set[str] = set()
    for record in tqdm(iter_records(inputs, stats), desc="sampling", unit=" docs", disable=not progress):
        text = record["text"]
        if not text.strip():
            counts.empty_skipped += 1
            continue
        key = f"{record['source']}\0{record['id']}"
        if key in inside:
            counts.duplicate_ids_in_sample += 1
            continue
        rank = split_score(key.encode("utf-8", "surrogatepass"), cfg.seed)
        if len(heap) >= cfg.sample and (-rank, key) <= heap[0][:2]:
            continue
        head = text[: cfg.max_chars] if cfg.max_chars else text
        entry = (-rank, key, {"id": record["id"], "source": record["source"], "text": head,
                              "truncated": len(head) < len(text), "url": record.get("url")})
        inside.add(key)
        if len(heap) < cfg.sample:
            heapq.heappush(heap, entry)
        else:
            inside.discard(heapq.heappushpop(heap, entry)[1])
    docs = []
    for _, key, r in sorted(heap, key=lambda e: (-e[0], e[1])):
        held = split_score(b"held-out\0" + key.encode("utf-8", "surrogatepass"), cfg.seed) < cfg.held_out
        docs.append(Document(key, r["id"], r["source"], r["text"], r["truncated"], r["url"], held))
    return docs


def read_annotations(path: Path, counts: RunCounts) -> dict[str, dict]:
    """{key: {"status", "score"}} of the annotations in `path`. A last line without its newline was torn by a
    kill: it is cut off the file (its document is annotated again) and counted; a line that is not an
    annotation is counted with its line number and skipped; a second line for a document is counted."""
    found: dict[str, dict] = {}
    if not path.exists():
        return found
    good_end = 0
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                counts.torn_lines += 1
                break
            good_end += len(line)
            if not line.strip():
                continue
            record = _annotation(line)
            if record is None:
                counts.note_bad_line(f"{path}:{lineno}")
                continue
            key = f"{record['source']}\0{record['id']}"
            if key in found:
                counts.duplicate_lines += 1
                continue
            scored = record["status"] == "scored"
            found[key] = {"status": record["status"], "score": record["score"] if scored else None}
    if counts.torn_lines:
        with naming_full_disk(path), open(path, "r+b") as f:
            f.truncate(good_end)
            os.fsync(f.fileno())
    return found


def _annotation(line: bytes) -> dict | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("id", "source")):
        return None
    score = record.get("score")
    if record.get("status") == "scored" and type(score) is int and 0 <= score <= 5:
        return record
    return record if record.get("status") == "unparsable" else None


def append_line(f: IO[bytes], record: dict) -> None:
    """One annotation, flushed and synced: a kill loses at most the line being written."""
    # backslashreplace keeps a lone surrogate as its JSON escape, so the line stays valid UTF-8 and valid JSON
    f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace"))
    f.flush()
    os.fsync(f.fileno())


def annotation_settings(inputs: Sequence[str | Path], cfg: AnnotateConfig, rubric: str) -> dict:
    return {"format": SETTINGS_FORMAT, "input": [str(Path(p).resolve()) for p in inputs], "model": cfg.model,
            "rubric_sha256": sha256_bytes(rubric.encode("utf-8", "surrogatepass")), "verdict": cfg.verdict,
            "seed": cfg.seed, "max_chars": cfg.max_chars, "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens, "sample": cfg.sample}


def check_settings(out: Path, saved: dict, wanted: dict) -> None:
    """A rerun into `out` continues its annotations only with the settings that made them (sample may grow)."""
    where = f"what {out} was annotated with (rerun with it to continue, or choose another --out)"
    for key in FIXED_SETTINGS:
        if saved.get(key) != wanted[key]:
            if key == "rubric_sha256":
                fail("rubric", "a prompt with sha256 " + wanted[key][:12], f"the rubric of {out / RUBRIC_FILE} "
                     f"(sha256 {str(saved.get(key))[:12]}), {where}")
            fail(key, wanted[key], f"{saved.get(key)!r}, {where}")
    if not isinstance(saved.get("sample"), int) or wanted["sample"] < saved["sample"]:
        fail("sample", wanted["sample"], f"at least {saved.get('sample')!r}, the sample {out} was annotated at "
             "(a sample may grow on a rerun, not shrink)")


def api_key(cfg: AnnotateConfig) -> str:
    """The key from the environment; a variable the user named must be set (the default one may be unset:
    a local server needs no key, and the client then sends a placeholder)."""
    key = os.environ.get(cfg.api_key_env, "")
    if not key and cfg.api_key_env != AnnotateConfig.api_key_env:
        fail("api_key_env", cfg.api_key_env, "the name of an environment variable that holds the API key (it is "
             "unset or empty)")
    return key or "none"


def check_resumable(out: Path) -> None:
    """DataError unless `out` holds annotations to continue."""
    if not (Path(out) / SETTINGS_FILE).is_file():
        raise DataError(f"cannot resume {out}: it holds no annotations ({SETTINGS_FILE} is missing); run without "
                        "--resume to start")


def annotate(inputs: Sequence[str | Path], out: str | Path, cfg: AnnotateConfig, *, resume: bool = False,
             progress: bool = True) -> dict:
    """Annotate the sample (what `out` does not hold yet), train the classifier, write the report; return it.

    Raises DataError after writing the report when the run stopped early (an endpoint that refuses every
    request, or `max_consecutive_failures` documents in a row failed): a rerun resumes it."""
    cfg.validate()
    rubric = load_rubric(cfg)
    key = api_key(cfg)
    out = Path(out)
    started = time.monotonic()
    with writer_lock(out):
        settings = annotation_settings(inputs, cfg, rubric)
        settings_path = out / SETTINGS_FILE
        if settings_path.exists():
            check_settings(out, read_json(settings_path, dict), settings)
        elif resume:
            check_resumable(out)
        counts, stats = RunCounts(), ReadStats()
        docs = draw_sample(inputs, cfg, stats, counts, progress)
        atomic_write_json(settings_path, settings)
        atomic_write_text(out / RUBRIC_FILE, rubric)
        done = read_annotations(out / ANNOTATIONS_FILE, counts)
        todo = [d for d in docs if d.key not in done]
        counts.already_annotated = len(docs) - len(todo)
        if todo:
            client = AnnotationClient(base_url(cfg.endpoint), cfg.model, rubric, key, verdict=cfg.verdict,
                                      timeout=cfg.timeout, max_retries=cfg.max_retries, backoff=cfg.backoff,
                                      rate=cfg.rate, temperature=cfg.temperature, max_tokens=cfg.max_tokens)
            with writing(out / ANNOTATIONS_FILE, "ab") as f:
                annotate_documents(client, todo, f, cfg, counts, done, progress)
        counts.elapsed_s = time.monotonic() - started
        classifier = train_classifier(docs, done, out, cfg)
        report = {"settings": {**{k: v for k, v in settings.items() if k != "format"},
                               "endpoint": shown_url(base_url(cfg.endpoint)), "api_key_env": cfg.api_key_env,
                               "threshold": cfg.threshold, "held_out": cfg.held_out},
                  "read": stats.to_dict(), **counts.report(docs, done), "classifier": classifier}
        write_report(out, report)
    if counts.stopped:
        raise DataError(f"{counts.stopped}; the {report['folder']['annotated']:,} annotations so far are kept in "
                        f"{out / ANNOTATIONS_FILE}: run the same command again to go on from there")
    return report


def annotate_documents(client: AnnotationClient, todo: list[Document], f: IO[bytes], cfg: AnnotateConfig,
                       counts: RunCounts, done: dict[str, dict], progress: bool) -> None:
    """Send `todo` with `cfg.concurrency` requests in flight; append each verdict as it comes back."""
    queue, pending = iter(todo), {}
    consecutive = 0
    bar = tqdm(total=len(todo), desc="annotating", unit=" docs", disable=not progress)
    with ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="annotate") as pool:
        try:
            while True:
                while len(pending) < cfg.concurrency and not client.stop.is_set():
                    doc = next(queue, None)
                    if doc is None:
                        break
                    pending[pool.submit(client.annotate, doc.text)] = doc
                if not pending:
                    break
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    doc, outcome = pending.pop(future), future.result()
                    counts.add(doc, outcome)
                    bar.update(1)
                    if outcome.status in ("scored", "unparsable"):
                        consecutive = 0
                        append_line(f, {"id": doc.id, "source": doc.source, "url": doc.url, "status": outcome.status,
                                        "score": outcome.score, "reasons": outcome.reasons, "answer": outcome.answer,
                                        "model": cfg.model, "attempts": outcome.attempts, "error": outcome.error,
                                        "text": doc.text, "truncated": doc.truncated})
                        done[doc.key] = {"status": outcome.status, "score": outcome.score}
                    elif outcome.status == "fatal" and not counts.stopped:
                        counts.stopped = f"the endpoint refused a request: {outcome.error}"
                        client.stop.set()
                    elif outcome.status == "failed":
                        consecutive += 1
                        if cfg.max_consecutive_failures and consecutive >= cfg.max_consecutive_failures \
                                and not counts.stopped:
                            counts.stopped = (f"stopped after {consecutive} documents in a row failed (the last: "
                                              f"{outcome.error})")
                            client.stop.set()
                bar.set_postfix(scored=counts.scored, unparsable=counts.unparsable, failed=counts.failed, refresh=False)
        finally:
            client.stop.set()  # a KeyboardInterrupt: threads stop waiting for their turn or their backoff
            bar.close()


def train_classifier(docs: list[Document], done: dict[str, dict], out: Path, cfg: AnnotateConfig) -> dict:
    """Train on the scored documents outside the held-out set and measure agreement on the held-out ones."""
    scored = [(d, done[d.key]["score"]) for d in docs if done.get(d.key, {}).get("status") == "scored"]
    fit = [(d, s) for d, s in scored if not d.held_out]
    positive = [d.text for d, s in fit if s >= cfg.threshold]
    negative = [d.text for d, s in fit if s < cfg.threshold]
    path = out / CLASSIFIER_FILE
    info = {"file": CLASSIFIER_FILE, "threshold": cfg.threshold, "train_positive": len(positive),
            "train_negative": len(negative)}
    if not positive or not negative:
        if path.exists():
            path.unlink()  # trained on other annotations: it must not pass for this report's classifier
        info["trained"] = False
        info["reason"] = (f"no classifier: training needs scored documents on both sides of threshold "
                          f"{cfg.threshold} (got {len(positive)} at or above, {len(negative)} below)")
        return info
    # holdout=0: the held-out annotations measure it below (train() still keeps one document of 10+ aside)
    model = train(positive, negative, FeatureSpec(bits=cfg.bits), epochs=cfg.epochs, holdout=0.0, seed=cfg.seed)
    model.save(path)
    held = [(d, s) for d, s in scored if d.held_out]
    info["trained"] = True
    info["held_out"] = evaluate_classifier(model.score([d.text for d, _ in held]) if held else [],
                                           [s for _, s in held], cfg.threshold)
    return info
