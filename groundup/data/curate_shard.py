"""Curate one shard of records: normalise, filter per domain, score, redact PII, hash for dedup.

What survives is written to the work directory as `stage-NNNNN.parquet` with its exact-dedup
hashes (`exact-NNNNN.npy`) and MinHash band keys or, with `dedup.near = "simhash"`, one column of
SimHash fingerprints (`bands-NNNNN.npy`); the shard's counters go
to `stats-NNNNN.json`, written last, so its presence means the shard is complete and a restarted
run skips it. Everything is written under a temporary name and renamed.

Workers each build one `ShardCurator` (the classifier and the MinHash permutations are loaded
once per process) and call it for each shard they are given.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from groundup.data import code_filters, gopher, web_filters
from groundup.data.classifier import QualityClassifier
from groundup.data.curate_config import CurateConfig, FILTER_NAMES
from groundup.data.minhash import MinHasher
from groundup.data.normalize import exact_key, normalize_text
from groundup.data.pii import PIIRedactor
from groundup.data.simhash import SimHasher
from groundup.data.stats import StageStats
from groundup.data.web.language import LanguageIdentifier
from groundup.data.web.perplexity import PerplexityScorer
from groundup.data.web.records import HTML_FORMAT, RecordExtractor
from groundup.data.web.url_lists import URLBlocker
from groundup.data.words import split_words
from groundup.io import atomic_open, atomic_write_json

CORE_FIELDS = ("id", "source", "domain", "text", "url", "language")
STAGE_SCHEMA = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("domain", pa.string()), ("text", pa.string()),
    ("url", pa.string()), ("language", pa.string()), ("quality", pa.float32()), ("meta", pa.string()),
    ("nbytes", pa.int64()),
])


def nbytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))


def shard_files(work: Path, index: int) -> dict[str, Path]:
    return {kind: work / f"{kind}-{index:05d}.{ext}" for kind, ext in
            (("stage", "parquet"), ("exact", "npy"), ("bands", "npy"), ("stats", "json"))}


def shard_complete(work: Path, index: int) -> bool:
    return all(p.exists() for p in shard_files(work, index).values())


class _Doc:
    """A record's current text with its words computed at most once (prose filters share them)."""

    def __init__(self, text: str):
        self.text = text
        self._words: list[str] | None = None

    @property
    def words(self) -> list[str]:
        if self._words is None:
            self._words = split_words(self.text)
        return self._words

    def replace(self, text: str) -> None:
        if text != self.text:
            self.text, self._words = text, None


class ShardCurator:
    """`checkpoint_scorer`: bits per byte under a groundup model, for `perplexity.checkpoint` (built by the
    caller, eval/bpb.CheckpointBitsPerByte: scoring with a model sits above the data layer)."""

    def __init__(self, cfg: CurateConfig, checkpoint_scorer=None):
        self.cfg = cfg
        # crawl pages: HTML to text (and language, unless the language stage does it) in the worker
        self.extractor = RecordExtractor(cfg.extract, identify_language=not cfg.language.enabled)
        self.language = LanguageIdentifier() if cfg.language.enabled else None
        self.perplexity = PerplexityScorer(cfg.perplexity, checkpoint_scorer) if cfg.perplexity.enabled else None
        self.near_hasher = SimHasher(cfg.dedup.simhash) if cfg.dedup.near == "simhash" else MinHasher(cfg.dedup.minhash)
        self.pii = PIIRedactor(cfg.pii)
        self.url_blocker = URLBlocker(cfg.url)  # its lists load on the first URL checked
        self.classifier = None
        if cfg.classifier.model:
            self.classifier = QualityClassifier.load(cfg.classifier.model)

    def _judge(self, name: str, doc: _Doc, record: dict) -> str | None:
        cfg = self.cfg
        if name == "gopher_quality":
            return gopher.gopher_quality(doc.text, doc.words, cfg.gopher_quality)
        if name == "gopher_repetition":
            return gopher.gopher_repetition(doc.text, doc.words, cfg.gopher_repetition)
        if name == "ngram_repetition":
            return gopher.ngram_repetition(doc.words, cfg.ngram_repetition)
        if name == "fineweb":
            return web_filters.fineweb(doc.text, doc.words, cfg.fineweb)
        if name == "c4":
            reason, text = web_filters.c4(doc.text, cfg.c4)
            if reason is None:
                doc.replace(text)  # C4 keeps the sentence-like lines only
            return reason
        if name == "code":
            return code_filters.code(doc.text, record, cfg.code)
        if name == "math":
            return code_filters.math_doc(doc.text, cfg.math)
        raise ValueError(f"unknown filter {name!r}")  # CurateConfig.validate rejects these first

    def _extract(self, record: dict, stats: StageStats) -> dict | None:
        """A crawl page's main content, title and language (data/web/records.py); None: no main content."""
        t0 = time.perf_counter()
        out = self.extractor(record)
        reason = None if out is not None else self.extractor.skip_reason()
        stats.record("extract", record, nbytes(record["text"]), reason, nbytes(out["text"]) if out else 0,
                     text=None if out else record.get("url"))
        stats.add_time("extract", time.perf_counter() - t0)
        return out

    def _language(self, doc: _Doc, record: dict, size: int, stats: StageStats) -> str | None:
        """Tag the record with its language (lid.176) and drop it unless a kept language scores above the
        threshold (datatrove's LanguageFilter), on the normalised text every later filter sees."""
        t0 = time.perf_counter()
        language, score, reason = self.language.verdict(doc.text, self.cfg.language)
        record["language"], record["language_score"] = language, round(score, 4)
        stats.count("language", language)
        stats.record("language", record, size, reason, text=doc.text)
        stats.add_time("language", time.perf_counter() - t0)
        return reason

    def _perplexity(self, doc: _Doc, record: dict, size: int, stats: StageStats) -> str | None:
        t0 = time.perf_counter()
        value = self.perplexity.score(doc.text, record.get("language"))
        record["perplexity"] = value
        bucket = self.perplexity.bucket(value, record.get("language"))
        stats.count("perplexity", bucket or "unbucketed")
        reason = self.perplexity.verdict(value, record.get("language"))
        stats.record("perplexity", record, size, reason, text=doc.text)
        stats.add_time("perplexity", time.perf_counter() - t0)
        return reason

    def _curate_record(self, record: dict, stats: StageStats) -> tuple[dict, str, float | None] | None:
        cfg, clock = self.cfg, time.perf_counter
        size = nbytes(record["text"])
        t0 = clock()
        doc = _Doc(normalize_text(record["text"], cfg.normalize.nfc, cfg.normalize.control_chars,
                                  cfg.normalize.line_endings))
        stats.record("normalize", record, size, None if doc.text.strip() else "empty", nbytes(doc.text))
        stats.add_time("normalize", clock() - t0)
        if not doc.text.strip():
            return None
        size = nbytes(doc.text)
        if cfg.url.enabled and record.get("url"):
            reason = self.url_blocker.check(str(record["url"]))
            stats.record("url", record, size, reason, text=doc.text)
            if reason:
                return None
        if self.language is not None and record["domain"] in cfg.language.domains:
            if self._language(doc, record, size, stats):
                return None
        for name in cfg.filters.get(record["domain"], ()):
            t0 = clock()
            reason = self._judge(name, doc, record)
            out = nbytes(doc.text) if name == "c4" and reason is None else size
            stats.record(name, record, size, reason, out, text=doc.text)
            stats.add_time(name, clock() - t0)
            if reason:
                return None
            size = out
        if self.perplexity is not None and record["domain"] in cfg.perplexity.domains:
            if self._perplexity(doc, record, size, stats):
                return None
        score = None
        if self.classifier is not None and record["domain"] in cfg.classifier.domains:
            t0 = clock()
            score = float(self.classifier.score([doc.text])[0])
            keep = cfg.classifier.top_fraction is not None or score >= cfg.classifier.threshold
            stats.record("classifier", record, size, None if keep else "below_threshold", text=doc.text)
            stats.add_time("classifier", clock() - t0)
            if not keep:
                return None
        if cfg.pii.enabled and record["domain"] in cfg.pii.domains:
            t0 = clock()
            text, counts = self.pii.redact(doc.text)
            for kind, n in counts.items():
                stats.count("pii", kind, n)
            stats.count("pii", "documents_changed", 1 if counts else 0)
            doc.replace(text)
            stats.add_time("pii", clock() - t0)
        return record, doc.text, score

    def _audit(self, records: list[dict], stats: StageStats) -> None:
        """Run the filters a domain is spared on a few of its documents, recording only what they
        would remove (as `audit:<filter>`), so the report shows the damage of applying them blindly."""
        seen: dict[str, int] = {}
        for record in records:
            domain = record["domain"]
            if seen.get(domain, 0) >= self.cfg.output.audit_docs:
                continue
            seen[domain] = seen.get(domain, 0) + 1
            text = normalize_text(record["text"])
            if not text.strip():
                continue
            for name in FILTER_NAMES:
                if name not in self.cfg.filters.get(domain, ()):
                    stats.record(f"audit:{name}", record, nbytes(text), self._judge(name, _Doc(text), record), text=text)

    def __call__(self, index: int, records: list[dict], work: Path) -> dict:
        """Curate `records` as shard `index`; returns the shard's stats dict."""
        cfg = self.cfg
        stats = StageStats(cfg.output.examples, cfg.output.snippet_chars)
        read = len(records)
        # Crawl pages become text first, so every later stage (and the audit) sees what a reader would. What
        # extraction remembers across pages (trafilatura's deduplication) lasts one crawl file, as a datatrove
        # task, or one shard if the file is longer: the same on any executor and any number of workers.
        self.extractor.reset()
        extracted, file = [], None
        for r in records:
            if r.get("format") == HTML_FORMAT:
                if file is not None and r["warc"]["file"] != file:
                    self.extractor.reset()
                file = r["warc"]["file"]
                r = self._extract(r, stats)
            if r is not None:
                extracted.append(r)
        records = extracted
        kept = [k for r in records if (k := self._curate_record(r, stats)) is not None]
        if cfg.output.audit_docs:
            self._audit(records, stats)
        t0 = time.perf_counter()
        texts = [text for _, text, _ in kept]
        exact = np.fromiter((exact_key(t) for t in texts), dtype=np.uint64, count=len(texts))
        stats.add_time("exact_dedup", time.perf_counter() - t0)
        t0 = time.perf_counter()
        near = cfg.dedup.near_config()  # MinHash band keys, or one column of SimHash fingerprints
        width = 1 if cfg.dedup.near == "simhash" else cfg.dedup.minhash.bands
        bands = np.zeros((len(texts), width), dtype=np.uint64)  # NO_KEY: never bucketed
        if near.enabled:
            rows = [i for i, (r, _, _) in enumerate(kept) if r["domain"] in near.domains]
            if rows:
                bands[rows] = self.near_hasher.keys_for_texts([texts[i] for i in rows])
        stats.add_time(f"{cfg.dedup.near}_dedup", time.perf_counter() - t0)
        files = shard_files(work, index)
        table = pa.table({
            "id": [r["id"] for r, _, _ in kept],
            "source": [r["source"] for r, _, _ in kept],
            "domain": [r["domain"] for r, _, _ in kept],
            "text": texts,
            "url": [str(r["url"]) if r.get("url") else None for r, _, _ in kept],
            "language": [r.get("language") for r, _, _ in kept],
            "quality": [s for _, _, s in kept],
            "meta": [_meta(r) for r, _, _ in kept],
            "nbytes": [nbytes(t) for t in texts],
        }, schema=STAGE_SCHEMA)
        with atomic_open(files["stage"], "wb") as f:
            pq.write_table(table, f, compression="zstd")
        for kind, array in (("exact", exact), ("bands", bands)):
            with atomic_open(files[kind], "wb") as f:
                np.save(f, array)
        result = {"index": index, "records": read, "kept": len(kept), "stages": stats.to_dict()}
        atomic_write_json(files["stats"], result, indent=None)  # last: marks the shard complete
        return result


def _meta(record: dict) -> str | None:
    """Fields beyond the core columns, as JSON (math problems keep their question and answer)."""
    extra = {k: v for k, v in record.items() if k not in CORE_FIELDS}
    return json.dumps(extra, ensure_ascii=False, default=str) if extra else None

