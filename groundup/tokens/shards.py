"""Token shards: flat token files, their index, writing them (`groundup data tokenize`) and reading them.

    index = tokenize_to_shards(["out/curated/shards"], "out/tokenizer", "out/tokens")
    (the function behind `groundup data tokenize`, whose command line is in groundup/tokenizer/commands.py)

Layout of the output directory:

    index.json                        written last: it lists only complete files
    train/<domain>-00000.bin          flat little-endian uint16 (vocab_size <= 65,536) or uint32 ids
    train/<domain>-00000.docs.npy     int64 start offset of each document in the .bin, then its length
    train/<domain>-00000.ids.jsonl    each document's record id, one JSON string per line
    val/...                           the same for the validation split

Each document is its tokens followed by the end-of-text id (groundup's <|end_of_text|>, or a Hugging
Face tokenizer's eos token; `bos_id` is None for one without a bos, such as Qwen's); a document never
spans two files and each file holds one domain, so the loader can weight domains by choosing among
files. Files are written under temporary names and renamed when complete; a previous index.json is
deleted before the first file is renamed over its predecessor, so a crash never leaves an index
vouching for files it does not describe.

index.json keys: format, version, dtype, vocab_size, eot_id, bos_id, tokenizer_hash, tokenizer,
val_fraction, seed, split_rule, tokens, documents, bytes, skipped_empty, read (the reader's counts of
bad records), inputs, seconds, and splits.{train,val}: tokens, documents, bytes (UTF-8 bytes of the
text, the denominator of bits-per-byte), domains.<domain> and sources.<source> (each with tokens,
documents, bytes), and shards: [{file, offsets, ids, domain, tokens, documents, bytes}] (paths
relative to the directory). Token counts include the end-of-text separators.

Split: a document goes to val when xxh64(its UTF-8 text, seed) / 2**64 < val_fraction, so the
split depends on the text alone (identical documents land together) and not on input order or
worker count. Each split gets at least one document: the lowest-scoring document is moved to val
if val would be empty, the highest-scoring to train if train would be.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import re
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import xxhash

from groundup.config import fail
from groundup.data.hashing import document_score, record_score, split_score as _score
from groundup.data.output import record_field
from groundup.errors import DataError
from groundup.io import atomic_open, atomic_write_json, ensure_writable_dir, read_json
from groundup.schema import check, relative_file

INDEX_FILE = "index.json"
FORMAT = "groundup-token-shards"
SPLITS = ("train", "val")
SPLIT_RULE = ("val when xxh64(utf-8 text, seed) / 2**64 < val_fraction; the lowest-scoring document "
              "goes to val if val would be empty, the highest-scoring to train if train would be")


@dataclasses.dataclass
class TokenizeConfig:
    val_fraction: float = 0.01  # share of documents in the validation split (at least one)
    seed: int = 0  # of the document hash that decides the split
    workers: int = 0  # encoding processes; 0: one per core
    shard_tokens: int = 1 << 27  # start a new file after this many tokens (256 MB at uint16)
    batch_bytes: int = 1 << 20  # text per unit of work sent to an encoding process
    default_domain: str | None = None  # domain of records that name none (default: "text")
    # Keep documents together in one split: a record field naming each document's group (e.g. "work":
    # every chunk and edition of a play); records without it split alone. Curated shards keep such
    # fields in their `meta` column, which is read too.
    split_group: str = ""
    split_group_fraction: float = 0.0  # the share of groups held out; 0: val_fraction

    def validate(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            fail("val_fraction", self.val_fraction, "a number in [0, 1)")
        if self.workers < 0:
            fail("workers", self.workers, "an integer >= 0 (0: one per core)")
        if self.shard_tokens < 1:
            fail("shard_tokens", self.shard_tokens, "a positive integer")
        if self.batch_bytes < 1:
            fail("batch_bytes", self.batch_bytes, "a positive integer")
        if not 0.0 <= self.split_group_fraction < 1.0:
            fail("split_group_fraction", self.split_group_fraction, "a number in [0, 1) (0: val_fraction)")



def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


# ----------------------------------------------------------------------------- writing


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


def _batches(records, cfg: TokenizeConfig, metas: collections.deque, skipped: collections.Counter
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


def _encode_documents(tok, texts: list[str], seed: int, dtype: str) -> tuple[np.ndarray, ...]:
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


def tokenize_to_shards(inputs: list[str | Path], tokenizer, out: str | Path, cfg: TokenizeConfig | None = None,
                       progress: bool = True) -> dict:
    """Encode the records of `inputs` into token shards under `out`; returns the index written."""
    from tqdm import tqdm

    from groundup.data.readers import ReadStats, iter_records
    from groundup.tokenizer import BaseTokenizer, load_tokenizer
    from groundup.tokenizer.parallel import map_batches

    cfg = cfg or TokenizeConfig()
    cfg.validate()
    given = isinstance(tokenizer, BaseTokenizer)
    tok = tokenizer if given else load_tokenizer(tokenizer)
    if tok.eot_id is None:  # either backend: groundup's always has one, a Hugging Face one names its eos token
        raise DataError(f"{tokenizer}: the tokenizer has no end-of-text (eos) token to separate documents; name "
                        "one as eos_token in its tokenizer_config.json")
    out = ensure_writable_dir(out)
    for split in SPLITS:
        (out / split).mkdir(exist_ok=True)
    dtype = token_dtype(tok.vocab_size)
    encode = functools.partial(_encode_documents, seed=cfg.seed, dtype=dtype.str)
    start = time.perf_counter()
    stats, metas, skipped = ReadStats(), collections.deque(), collections.Counter()
    records = iter_records(inputs, stats, cfg.default_domain)
    shards, order = _ShardSet(out, cfg.shard_tokens), 0
    splitter = _Splitter(cfg.val_fraction, ", ".join(map(str, inputs)))
    group_scale = cfg.val_fraction / (cfg.split_group_fraction or cfg.val_fraction or 1.0)
    groups: dict[str, set[str]] = {split: set() for split in SPLITS}
    group_of: dict[str, str] = {}
    bar = tqdm(desc="tokenize", unit="B", unit_scale=True, disable=not progress)
    try:
        for tokens, lengths, nbytes, scores in map_batches(tok, _batches(records, cfg, metas, skipped), encode,
                                                           cfg.workers):
            ends = np.cumsum(lengths)
            for k, (rid, source, domain, group) in enumerate(metas.popleft()):
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
            bar.update(int(nbytes.sum()))
        for split, d in splitter.finish():
            shards.add(split, d)
            if d.id in group_of:
                groups[split].add(group_of[d.id])
        splits = shards.close()
    except BaseException:
        shards.abort()
        raise
    finally:
        bar.close()
    index = {
        "format": FORMAT, "version": 1, "dtype": dtype.name, "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id, "bos_id": tok.bos_id, "tokenizer_hash": tok.hash,
        "tokenizer": None if given else str(tokenizer),
        "val_fraction": cfg.val_fraction, "seed": cfg.seed, "split_rule": SPLIT_RULE,
        **{k: sum(splits[s][k] for s in SPLITS) for k in ("tokens", "documents", "bytes")},
        "skipped_empty": skipped["empty"], "read": stats.to_dict(), "inputs": [str(p) for p in inputs],
        "seconds": round(time.perf_counter() - start, 3), "splits": splits,
        "split_group": cfg.split_group or None,
        "groups": {s: sorted(g) for s, g in groups.items()} if cfg.split_group else None,
    }
    atomic_write_json(out / INDEX_FILE, index)
    _remove_stale(out, index)
    return index


def _remove_stale(out: Path, index: dict) -> None:
    """Delete shard files of an earlier run into the same directory that this index does not list."""
    listed = {e[k] for s in SPLITS for e in index["splits"][s]["shards"] for k in ("file", "offsets", "ids")}
    for split in SPLITS:
        for path in (out / split).glob("*-[0-9][0-9][0-9][0-9][0-9].*"):
            if path.name.endswith((".bin", ".docs.npy", ".ids.jsonl")) and f"{split}/{path.name}" not in listed:
                path.unlink()


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass
class ShardFile:
    """One .bin file of a split, opened for reading: tokens memory-mapped, document starts loaded."""

    path: Path
    domain: str
    tokens: np.ndarray  # memmap of the flat ids
    starts: np.ndarray  # int64 start of each document, then the file's length
    first_doc: int  # index of this file's first document among all documents of the split
    ids_path: Path

    @property
    def documents(self) -> int:
        return len(self.starts) - 1


_SHARD = {"file": str, "offsets": str, "ids": str, "domain": str, "tokens": int, "documents?": int, "bytes?": int}
_SPLIT = {"tokens": int, "documents": int, "bytes": int, "domains?": dict, "sources?": dict, "shards": [_SHARD]}
INDEX_SCHEMA = {"format": str, "dtype": str, "vocab_size": int, "eot_id": int, "bos_id?": (int, None),
                "tokenizer_hash?": (str, None), "splits": {"train?": _SPLIT, "val?": _SPLIT}}


def read_index(shard_dir: str | Path) -> dict:
    """The index of a shard directory; DataError when missing (not shards, or tokenize did not finish)."""
    path = Path(shard_dir) / INDEX_FILE
    if not path.is_file():
        raise DataError(f"{path}: no index: not a token shard directory, or 'groundup data tokenize' "
                        "did not finish (the index is written last)")
    index = read_json(path, expect=dict)
    if index.get("format") != FORMAT:
        raise DataError(f"{path}: format {index.get('format')!r} is not {FORMAT!r}")
    check(index, INDEX_SCHEMA, str(path))
    if index["dtype"] not in ("uint16", "uint32"):
        raise DataError(f"{path}: dtype = {index['dtype']!r}: expected uint16 or uint32")
    for split in index["splits"].values():
        for i, entry in enumerate(split["shards"]):
            for key in ("file", "offsets", "ids"):
                relative_file(entry[key], str(path), f"shards[{i}].{key}")
            if entry["tokens"] < 0:
                raise DataError(f"{path}: shards[{i}].tokens = {entry['tokens']}: expected a count >= 0")
    return index


def check_tokenizer(index: dict, expected_hash: str | None, where: str | Path) -> None:
    """Refuse shards made by another tokenizer than the run's (naming both hashes)."""
    if expected_hash is not None and index.get("tokenizer_hash") != expected_hash:
        raise DataError(f"{where}: token shards were made by tokenizer {index.get('tokenizer_hash')}, but this "
                        f"run uses tokenizer {expected_hash}; re-run 'groundup data tokenize' with the run's "
                        "tokenizer")


def open_split(shard_dir: str | Path, split: str, index: dict | None = None) -> list[ShardFile]:
    """Open every file of `split` (train or val), checking each file's size against the index."""
    shard_dir = Path(shard_dir)
    index = index or read_index(shard_dir)
    if split not in index["splits"]:
        raise DataError(f"{shard_dir}: no split {split!r}; the index has {', '.join(index['splits'])}")
    dtype = np.dtype(index["dtype"]).newbyteorder("<")
    files, first = [], 0
    for entry in index["splits"][split]["shards"]:
        path = shard_dir / entry["file"]
        size = path.stat().st_size if path.is_file() else -1
        if size != entry["tokens"] * dtype.itemsize:
            raise DataError(f"{path}: {'missing' if size < 0 else f'{size:,} bytes'}, but the index says "
                            f"{entry['tokens']:,} tokens of {dtype.name}: the shard directory is damaged")
        starts = np.load(shard_dir / entry["offsets"], allow_pickle=False)
        tokens = np.memmap(path, dtype=dtype, mode="r")
        files.append(ShardFile(path, entry["domain"], tokens, starts, first, shard_dir / entry["ids"]))
        first += len(starts) - 1
    return files


def document_ids(files: list[ShardFile], docs: list[int]) -> list[str]:
    """Record ids of documents numbered as `ShardFile.first_doc` counts them (reads the ids files)."""
    wanted, found = set(docs), {}
    for f in files:
        hits = [d for d in wanted if f.first_doc <= d < f.first_doc + f.documents]
        if hits:
            with open(f.ids_path, encoding="utf-8") as fh:
                lines = fh.readlines()
            found.update({d: json.loads(lines[d - f.first_doc]) for d in hits})
    return [found.get(d, f"#{d}") for d in docs]
