"""Writing token shards (the format is in tokens/shards.py): documents routed to their split and
to one file per split and domain, files cut at `shard_tokens`, each written under a temporary name.

    encode_here(...)    encoded batches from processes on this machine (`--executor local`)
    write_splits(...)   every encoded document, in input order, to its split and file

`write_splits` takes encoded batches from anywhere: `encode_here`, or the files the Ray tasks of
`--executor ray` left (tokens/ray_tokenize.py), so both executors write the same bytes.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from groundup.data.hashing import record_score, split_score as _score
from groundup.data.output import record_field
from groundup.data.readers import iter_records
from groundup.errors import DataError
from groundup.io import atomic_open
from groundup.tokenizer.parallel import map_batches

if TYPE_CHECKING:
    from groundup.tokens.shards import TokenizeConfig

INDEX_FILE = "index.json"
SPLITS = ("train", "val")


@dataclasses.dataclass
class _Doc:
    tokens: np.ndarray  # with the end-of-text id appended
    id: str
    source: str
    domain: str
    nbytes: int
    score: float
    order: int  # arrival number: breaks score ties so the held documents stay distinct


def _counts() -> dict:
    return {"tokens": 0, "documents": 0, "bytes": 0}


def _add_counts(counts: dict, doc: _Doc) -> None:
    counts["tokens"] += len(doc.tokens)
    counts["documents"] += 1
    counts["bytes"] += doc.nbytes


class _ShardWriter:
    """Writes one split's documents of one domain into files of about `shard_tokens` tokens."""

    def __init__(self, out: Path, split: str, stem: str, domain: str, shard_tokens: int):
        self.out, self.split, self.stem, self.domain, self.limit = out, split, stem, domain, shard_tokens
        self.entries: list[dict] = []
        self._file = None

    def _open(self) -> None:
        self.name = f"{self.split}/{self.stem}-{len(self.entries):05d}"
        self._ctx = atomic_open(self.out / f"{self.name}.bin", "wb")
        self._file = self._ctx.__enter__()
        self.starts, self.ids, self.counts = [0], [], _counts()
        self.buffer: list[np.ndarray] = []
        self.buffered = 0

    def _flush(self) -> None:
        # One write per megatoken: per-document writes of short documents cost more than encoding them.
        if self.buffer:
            self._file.write(np.concatenate(self.buffer).tobytes())
            self.buffer, self.buffered = [], 0

    def add(self, doc: _Doc) -> None:
        if self._file is None:
            self._open()
        self.buffer.append(doc.tokens)
        self.buffered += len(doc.tokens)
        self.starts.append(self.starts[-1] + len(doc.tokens))
        self.ids.append(doc.id)
        _add_counts(self.counts, doc)
        if self.buffered >= 1 << 20:
            self._flush()
        if self.counts["tokens"] >= self.limit:
            self.close()

    def close(self) -> None:
        if self._file is None:
            return
        self._flush()
        # An index from an earlier run must not vouch for the files about to be replaced; it is
        # removed only now, so input that fails early leaves the earlier output intact.
        (self.out / INDEX_FILE).unlink(missing_ok=True)
        self._ctx.__exit__(None, None, None)  # fsync and rename the .bin into place
        with atomic_open(self.out / f"{self.name}.docs.npy", "wb") as f:
            np.save(f, np.asarray(self.starts, dtype=np.int64))
        with atomic_open(self.out / f"{self.name}.ids.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(i, ensure_ascii=False) + "\n" for i in self.ids)
        self.entries.append({"file": f"{self.name}.bin", "offsets": f"{self.name}.docs.npy",
                             "ids": f"{self.name}.ids.jsonl", "domain": self.domain, **self.counts})
        self._file = None

    def abort(self) -> None:
        if self._file is not None:
            self._ctx.__exit__(DataError, DataError("aborted"), None)  # removes the temporary file


class _Splitter:
    """Routes documents to splits, holding back the lowest- and highest-scoring ones until the end
    so that each split can be guaranteed a document without a second pass over the input."""

    def __init__(self, val_fraction: float, where: str):
        self.fraction, self.where = val_fraction, where
        self.low: _Doc | None = None
        self.high: _Doc | None = None
        self.seen = collections.Counter()

    def natural(self, doc: _Doc) -> str:
        return "val" if doc.score < self.fraction else "train"

    def _release(self, doc: _Doc | None) -> Iterator[tuple[str, _Doc]]:
        if doc is not None and doc is not self.low and doc is not self.high:
            self.seen[self.natural(doc)] += 1
            yield self.natural(doc), doc

    def add(self, doc: _Doc) -> Iterator[tuple[str, _Doc]]:
        old_low, old_high = self.low, self.high
        if self.low is None or (doc.score, doc.order) < (self.low.score, self.low.order):
            self.low = doc
        if self.high is None or (doc.score, doc.order) > (self.high.score, self.high.order):
            self.high = doc
        for d in {id(x): x for x in (old_low, old_high, doc) if x is not None}.values():
            yield from self._release(d)

    def finish(self) -> Iterator[tuple[str, _Doc]]:
        if self.low is None or self.low is self.high:
            n = 0 if self.low is None else 1
            raise DataError(f"{self.where}: {n} non-empty document(s): need at least 2, one for training "
                            "and one for validation")
        low, high = self.natural(self.low), self.natural(self.high)
        counts = self.seen + collections.Counter([low, high])
        if not counts["val"]:
            low = "val"  # both held documents were train: the lower one becomes val's document
        elif not counts["train"]:
            high = "train"
        yield low, self.low
        yield high, self.high


def _stem(domain: str, taken: dict[str, str]) -> str:
    """A file-name-safe, unique stem for a domain."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", domain).strip("._") or "domain"
    stem, n = base, 1
    while taken.get(stem, domain) != domain:
        n += 1
        stem = f"{base}_{n}"
    taken[stem] = domain
    return stem


class _ShardSet:
    """All writers of both splits, plus the per-split counts for the index."""

    def __init__(self, out: Path, shard_tokens: int):
        self.out, self.shard_tokens = out, shard_tokens
        self.writers: dict[tuple[str, str], _ShardWriter] = {}
        self.stems: dict[str, str] = {}
        self.splits = {s: {**_counts(), "domains": {}, "sources": {}} for s in SPLITS}

    def add(self, split: str, doc: _Doc) -> None:
        key = (split, doc.domain)
        if key not in self.writers:
            stem = _stem(doc.domain, self.stems)
            self.writers[key] = _ShardWriter(self.out, split, stem, doc.domain, self.shard_tokens)
        self.writers[key].add(doc)
        info = self.splits[split]
        _add_counts(info, doc)
        _add_counts(info["domains"].setdefault(doc.domain, _counts()), doc)
        _add_counts(info["sources"].setdefault(doc.source, _counts()), doc)

    def close(self) -> dict:
        for writer in self.writers.values():
            writer.close()
        for split, info in self.splits.items():
            info["shards"] = [e for (s, _), w in sorted(self.writers.items()) if s == split for e in w.entries]
        return self.splits

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()


def text_batches(records, cfg: TokenizeConfig, metas: collections.deque, skipped: collections.Counter
                 ) -> Iterator[list[str]]:
    """Group record texts into units of about `batch_bytes`; their metadata waits in `metas`."""
    texts, meta, size = [], [], 0
    for record in records:
        text = record["text"]
        if not text:
            skipped["empty"] += 1
            continue
        group = record_field(record, cfg.split_group) if cfg.split_group else None
        meta.append((record["id"], record["source"], record["domain"], group))
        texts.append(text)
        size += len(text)
        if size >= cfg.batch_bytes:
            metas.append(meta)
            yield texts
            texts, meta, size = [], [], 0
    if texts:
        metas.append(meta)
        yield texts


def encode_documents(tok, texts: list[str], seed: int, dtype: str) -> tuple[np.ndarray, ...]:
    """In a worker: the batch's tokens with an end-of-text after each document, and per document
    its token count (end-of-text included), UTF-8 bytes and split score."""
    arrays, nbytes, scores = [], [], []
    eot = np.array([tok.eot_id], dtype=np.uint32)
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")  # a lone surrogate counts as the 3 bytes of U+FFFD
        nbytes.append(len(data))
        scores.append(_score(data, seed))
        arrays += [tok.encode_to_numpy(text), eot]
    lengths = np.array([len(a) + 1 for a in arrays[::2]], dtype=np.int64)
    return np.concatenate(arrays).astype(dtype), lengths, np.array(nbytes), np.array(scores)


def encode_here(inputs, tok, cfg: TokenizeConfig, dtype: np.dtype, stats, skipped: collections.Counter,
                 progress: bool) -> Iterator[tuple]:
    """Encoded batches (tokens, lengths, bytes, scores, metas) in input order, from processes on this machine."""
    from tqdm import tqdm

    metas: collections.deque = collections.deque()
    encode = functools.partial(encode_documents, seed=cfg.seed, dtype=dtype.str)
    batches = text_batches(iter_records(inputs, stats, cfg.default_domain), cfg, metas, skipped)
    with tqdm(desc="tokenize", unit="B", unit_scale=True, disable=not progress) as bar:
        for tokens, lengths, nbytes, scores in map_batches(tok, batches, encode, cfg.workers):
            yield tokens, lengths, nbytes, scores, metas.popleft()
            bar.update(int(nbytes.sum()))


def write_splits(batches: Iterator[tuple], out: Path, cfg: TokenizeConfig, where: str) -> tuple[dict, dict]:
    """Route every encoded document to its split and file; returns the splits' counts and the groups."""
    shards, order = _ShardSet(out, cfg.shard_tokens), 0
    splitter = _Splitter(cfg.val_fraction, where)
    group_scale = cfg.val_fraction / (cfg.split_group_fraction or cfg.val_fraction or 1.0)
    groups: dict[str, set[str]] = {split: set() for split in SPLITS}
    group_of: dict[str, str] = {}
    try:
        for tokens, lengths, nbytes, scores, metas in batches:
            ends = np.cumsum(lengths)
            for k, (rid, source, domain, group) in enumerate(metas):
                score = float(scores[k])
                if group is not None:  # the group decides: every chunk and edition of a work goes together
                    score = record_score("", cfg.seed, group, group_scale)
                    group_of[rid] = str(group)
                doc = _Doc(tokens[ends[k] - lengths[k]:ends[k]], rid, source, domain, int(nbytes[k]), score, order)
                order += 1
                for split, d in splitter.add(doc):
                    shards.add(split, d)
                    if d.id in group_of:
                        groups[split].add(group_of[d.id])
        for split, d in splitter.finish():
            shards.add(split, d)
            if d.id in group_of:
                groups[split].add(group_of[d.id])
        return shards.close(), groups
    except BaseException:
        shards.abort()
        raise


def remove_stale(out: Path, index: dict) -> None:
    """Delete shard files of an earlier run into the same directory that this index does not list."""
    listed = {e[k] for s in SPLITS for e in index["splits"][s]["shards"] for k in ("file", "offsets", "ids")}
    for split in SPLITS:
        for path in (out / split).glob("*-[0-9][0-9][0-9][0-9][0-9].*"):
            if path.name.endswith((".bin", ".docs.npy", ".ids.jsonl")) and f"{split}/{path.name}" not in listed:
                path.unlink()
