"""Exact substring deduplication (Lee et al. 2022, "Deduplicating Training Data Makes Language Models
Better"): every span of at least `min_tokens` tokens that occurs more than once in the corpus is cut
out of every document it occurs in; the rest of each document is kept as it was.

What is removed. Lee et al.'s `self-similar` marks every position whose next L units equal those of
the adjacent suffix in the suffix array (every occurrence, the first one too), `collect` merges the
marked windows [x, x+L) into ranges and `finish_single_file` deletes all ranges. So ALL occurrences of
a repeated span go, not all but one; this module does the same. The union of repeated windows can
hold a stretch that never repeats as a whole (Lee et al. note it too): each of its windows does.

Unit of N: tokens, not bytes. A token is a word (a run of letters, digits and underscores), a run of
other non-space characters (punctuation), or one character of a script written without spaces
(Chinese, Japanese kana, Thai); `TOKEN_RE`. The embedded Shakespeare averages 4.3 characters a token
(measured); a token is roughly one GPT-2 token or more (BPE splits rare words further), so 50 here is
about as long as Lee et al.'s 50 GPT-2 tokens or a little longer. Lee et al. used GPT-2 token ids
or bytes; a groundup tokenizer does not exist yet when the corpus is curated, and word-level tokens
keep every cut on token boundaries (never inside a word or a UTF-8 character), while whitespace between
tokens is not compared, so a paragraph re-wrapped elsewhere still matches. A cut runs from the first
character of its first token to the last of its last token: the whitespace around it stays.
A document left with only whitespace is dropped (and counted); documents never match across each other's
ends (a unique separator follows each one).

Suffix array. Each document's tokens become integer ids (exact: a dictionary per piece, no hashing),
`pydivsufsort.divsufsort` sorts the suffixes of the ids (it takes integer arrays) and `kasai` gives the
longest common prefix of neighbours; LCP >= N marks both neighbours' windows, as Lee et al.

Bounded memory. The suffix array is built over pieces of the corpus of at most `memory_mb` (about
`BYTES_PER_TOKEN` bytes a token while it is built; add about 30 MB and one work shard's text). One
piece (the corpus fits): exactly the method above. Several pieces: Lee et al. merge the pieces' suffix arrays, which needs the whole corpus text in
memory; instead, every N-token window of every piece gets a 64-bit fingerprint (`hashing.window_hashes`
over xxh3 token hashes), each piece's distinct fingerprints are written sorted, and the fingerprints
are then read back one key bucket at a time (sized to `memory_mb`): one present in two pieces marks
that window in both. Repeats within a piece come from its suffix array (exact), repeats across pieces
from equal fingerprints (two different windows agree with probability about 2**-64). Pieces are
tokenised twice in that case (fingerprints first, then suffix arrays with the cross-piece marks).

Files. `substring_dedup` (called by the pipeline after near-deduplication, on the documents still
alive whose domain is in `domains`) writes `OUT/.work/substr-NNNNN.npy` for every output shard (int64
rows: work-shard row, start and end character of a cut, its UTF-8 bytes; a dropped document's one cut
is the whole text) and `substr-done.json` last; a restart with those in place reuses them.
`output.write_output_shard` applies them, so `--executor ray` (whose output tasks read the same files)
writes the same bytes as the local run. This stage itself runs in the driver process in both cases.
"""

from __future__ import annotations

import importlib.util
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow.parquet as pq
import xxhash

from groundup.config import fail
from groundup.data.hashing import fmix64, window_hashes
from groundup.data.stats import StageStats
from groundup.io import atomic_open, atomic_write_json, read_json

_NO_SPACE = "\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
TOKEN_RE = re.compile(rf"[{_NO_SPACE}]|[^\W{_NO_SPACE}]+|[^\w\s{_NO_SPACE}]+")
# Measured peak per token of a piece (suffix array + LCP, or its window fingerprints and their sort,
# with the piece's ids and texts): about 50-95 bytes on the benchmark's pages (benchmarks/substring_dedup.py).
BYTES_PER_TOKEN = 96
DONE_FILE = "substr-done.json"


@dataclass
class SubstringDedupConfig:
    """Cut spans repeated anywhere in the corpus (Lee et al. 2022's ExactSubstr); see the module docstring."""

    # cut every span of >= min_tokens tokens that occurs twice or more (all its occurrences); false: off
    enabled: bool = False
    # shortest span cut, in TOKENS (words, punctuation runs, single CJK/Thai characters; about 4.3
    # characters each in English, ~1 GPT-2 token): 50 as Lee et al.
    min_tokens: int = 50
    domains: list[str] = field(default_factory=lambda: ["text"])  # domains compared with each other and cut
    memory_mb: int = 256  # suffix arrays are built over pieces of the corpus of at most about this much

    def validate(self) -> None:
        if self.min_tokens < 1:
            fail("min_tokens", self.min_tokens, "at least 1")
        if self.memory_mb < 1:
            fail("memory_mb", self.memory_mb, "at least 1")
        if self.enabled and not self.domains:
            fail("domains", self.domains, "at least one domain (or enabled = false)")
        if self.enabled and importlib.util.find_spec("pydivsufsort") is None:  # fail before hours of curation
            fail("enabled", self.enabled, "pydivsufsort installed: pip install 'groundup[web]'")


@dataclass
class SubstringResult:
    removed_bytes: np.ndarray  # int64 per document (global number): UTF-8 bytes cut from it
    emptied: np.ndarray  # bool per document: only whitespace was left, so it is dropped
    spans: int  # cuts made
    pieces: int  # pieces the corpus was cut into for the suffix arrays (0 when reused)
    reused: bool = False  # the files of a complete earlier run of this directory were read back


# ----------------------------------------------------------------------------- the method


@dataclass
class _Piece:
    keys: list  # one per document, whatever the caller gave
    texts: list[str]
    tokens: np.ndarray  # uint32: D + vocabulary id per token; document d's separator (value d) follows it
    starts: np.ndarray  # where each document's tokens begin in `tokens`, then len(tokens)
    vocab: list[str]  # token strings by id
    last: bool  # no document follows


def _piece(keys: list, texts: list[str], ids: list[np.ndarray], vocab: dict, last: bool) -> _Piece:
    lengths = np.array([len(i) for i in ids], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths + 1))).astype(np.int64)
    tokens = np.empty(int(starts[-1]), dtype=np.uint32)
    is_token = np.ones(len(tokens), dtype=bool)
    is_token[starts[1:] - 1] = False
    tokens[~is_token] = np.arange(len(ids), dtype=np.uint32)
    tokens[is_token] = (np.concatenate(ids) if ids else np.zeros(0, np.uint32)) + np.uint32(len(ids))
    return _Piece(keys, texts, tokens, starts, list(vocab), last)


def _pieces(docs: Iterable[tuple[Any, str]], piece_tokens: int) -> Iterator[_Piece]:
    """The documents in order, cut into pieces of at most `piece_tokens` tokens (a longer document is
    a piece of its own)."""
    vocab: dict[str, int] = {}
    keys, texts, ids, size = [], [], [], 0
    for key, text in docs:
        words = TOKEN_RE.findall(text)
        if keys and size + len(words) > piece_tokens:
            yield _piece(keys, texts, ids, vocab, last=False)
            vocab, keys, texts, ids, size = {}, [], [], [], 0
        get = vocab.setdefault
        ids.append(np.fromiter([get(w, len(vocab)) for w in words], dtype=np.uint32, count=len(words)))
        keys.append(key)
        texts.append(text)
        size += len(words)
    if keys:
        yield _piece(keys, texts, ids, vocab, last=True)


def _fingerprints(piece: _Piece, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A 64-bit fingerprint of the window of `n` tokens at every position, and whether the window
    lies inside one document (no separator in it)."""
    tokens, docs = piece.tokens, len(piece.keys)
    if len(tokens) < n:
        return np.zeros(0, np.uint64), np.zeros(0, bool)
    # xxh3 directly, not hashing.word_hash: that cache grows to a million words
    vocab_hash = np.fromiter((xxhash.xxh3_64_intdigest(w.encode("utf-8", "surrogatepass")) for w in piece.vocab),
                             dtype=np.uint64, count=len(piece.vocab))
    is_token = tokens >= docs
    seps = np.concatenate(([0], np.cumsum(~is_token, dtype=np.int32)))
    inside = seps[n:] - seps[:-n] == 0
    del seps
    hashes = np.zeros(len(tokens), dtype=np.uint64)
    hashes[is_token] = vocab_hash[tokens[is_token] - docs]
    return fmix64(window_hashes(hashes, n)), inside


def _member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    if not len(sorted_set):
        return np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[at] == values


def _covered(piece: _Piece, n: int, cross: np.ndarray | None) -> np.ndarray:
    """Which token positions of the piece lie in a window of `n` tokens that occurs twice or more:
    in this piece (suffix array + LCP) or, with `cross` (sorted fingerprints), in another piece."""
    from pydivsufsort import divsufsort, kasai  # the `web` extra: only this stage needs it

    tokens = piece.tokens
    marks = np.zeros(len(tokens), dtype=bool)
    if len(tokens) > n:
        sa = divsufsort(tokens)
        lcp = kasai(tokens, sa)  # lcp[i]: common prefix of suffixes sa[i] and sa[i+1]
        hit = np.flatnonzero(lcp[:-1] >= n)
        marks[sa[hit]] = True
        marks[sa[hit + 1]] = True
        del sa, lcp
    if cross is not None and len(cross):
        fp, inside = _fingerprints(piece, n)
        marks[: len(fp)] |= inside & _member(fp, cross)
    count = np.concatenate(([0], np.cumsum(marks)))
    end = np.arange(1, len(tokens) + 1)
    return count[end] - count[np.maximum(end - n, 0)] > 0  # some marked window [x, x+n) covers it


def _doc_spans(piece: _Piece, covered: np.ndarray) -> Iterator[tuple[Any, str, list[tuple[int, int]]]]:
    for d, key in enumerate(piece.keys):
        cov = covered[piece.starts[d]: piece.starts[d + 1] - 1]
        if not cov.any():
            continue
        text = piece.texts[d]
        bounds = [m.span() for m in TOKEN_RE.finditer(text)]
        edges = np.flatnonzero(np.diff(np.concatenate(([0], cov.view(np.int8), [0]))))
        yield key, text, [(bounds[a][0], bounds[b - 1][1]) for a, b in zip(edges[0::2], edges[1::2])]


def _cross_fingerprints(scratch: Path, pieces: int, memory_bytes: int, buckets: int | None) -> None:
    """Per piece, its window fingerprints also present in another piece (`cross-PPPPP.bin`), one key
    bucket of all pieces' sorted fingerprints at a time."""
    files = [np.load(scratch / f"fp-{p:05d}.npy", mmap_mode="r") for p in range(pieces)]
    total = sum(len(f) for f in files)
    buckets = buckets or max(1, math.ceil(total * 48 / memory_bytes))  # a bucket's values, sorted copy and masks
    bits = (buckets - 1).bit_length()  # bucket b: the fingerprints whose top `bits` bits are b
    bounds = [0] + [np.uint64(b) << np.uint64(64 - bits) for b in range(1, 1 << bits)] + [None]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        parts = [np.asarray(f[np.searchsorted(f, lo):len(f) if hi is None else np.searchsorted(f, hi)]) for f in files]
        values = np.sort(np.concatenate(parts))
        repeated = np.unique(values[1:][values[1:] == values[:-1]])  # each piece's values are distinct
        for p, part in enumerate(parts):
            with open(scratch / f"cross-{p:05d}.bin", "ab") as out:  # appended bucket by bucket: stays sorted
                out.write(part[_member(part, repeated)].tobytes())


def repeated_spans(docs: Callable[[], Iterable[tuple[Any, str]]], min_tokens: int, piece_tokens: int,
                   scratch: Path, memory_bytes: int, buckets: int | None = None
                   ) -> Iterator[list[tuple[Any, str, list[tuple[int, int]]]]]:
    """For each piece, the documents with something to cut: (key, text, [(start, end) characters]).

    `docs()` yields (key, text) in corpus order, the same each call (it is read twice when the
    corpus needs several pieces). `scratch` is an empty directory for the cross-piece files."""
    n = min_tokens
    pieces = 0
    for piece in _pieces(docs(), piece_tokens):
        if piece.last and pieces == 0:  # the whole corpus in one suffix array
            yield list(_doc_spans(piece, _covered(piece, n, None)))
            return
        fp, inside = _fingerprints(piece, n)
        fp = fp[inside]
        fp.sort()
        with atomic_open(scratch / f"fp-{pieces:05d}.npy", "wb") as f:
            np.save(f, fp[np.concatenate(([True], fp[1:] != fp[:-1]))] if len(fp) else fp)
        del fp, inside
        pieces += 1
    if pieces == 0:
        return
    _cross_fingerprints(scratch, pieces, memory_bytes, buckets)
    for p, piece in enumerate(_pieces(docs(), piece_tokens)):
        cross = np.fromfile(scratch / f"cross-{p:05d}.bin", dtype=np.uint64)
        yield list(_doc_spans(piece, _covered(piece, n, cross)))


# ----------------------------------------------------------------------------- the pipeline's stage


def _utf8(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))


def removal_path(work: Path, index: int) -> Path:
    """The cuts of output shard `index`: int64 rows (row, start, end, bytes)."""
    return work / f"substr-{index:05d}.npy"


def load_removals(path: Path | None) -> np.ndarray:
    if path is None or not Path(path).exists():
        return np.zeros((0, 4), dtype=np.int64)
    return np.load(path).reshape(-1, 4)


def removed_per_row(spans: np.ndarray, rows: int) -> np.ndarray:
    return np.bincount(spans[:, 0], weights=spans[:, 3], minlength=rows).astype(np.int64)


def cut(text: str, spans: np.ndarray) -> str:
    """`text` without the character ranges (start, end) in `spans` (sorted, disjoint)."""
    out, at = [], 0
    for start, end in spans:
        out.append(text[at:start])
        at = end
    out.append(text[at:])
    return "".join(out)


def apply_removals(texts: list[str], spans: np.ndarray) -> list[str]:
    """Each row's text with its cuts applied (rows without cuts unchanged)."""
    texts = list(texts)
    if len(spans):
        bounds = np.flatnonzero(np.diff(spans[:, 0])) + 1
        for group in np.split(spans, bounds):
            row = int(group[0, 0])
            texts[row] = cut(texts[row], group[:, 1:3])
    return texts


def _cuts(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans, or the whole text when what they leave is only whitespace."""
    gaps = [text[a:b] for a, b in zip([0] + [e for _, e in spans], [s for s, _ in spans] + [len(text)])]
    return [(0, len(text))] if not "".join(gaps).strip() else spans


def _stage_docs(stage_files: Sequence[Path], offsets: np.ndarray, considered: np.ndarray
                ) -> Callable[[], Iterator[tuple[tuple[int, int], str]]]:
    def docs():
        for shard, path in enumerate(stage_files):
            rows = np.flatnonzero(considered[offsets[shard]:offsets[shard + 1]])
            if len(rows):
                texts = pq.read_table(path, columns=["text"]).column("text").take(rows).to_pylist()
                yield from (((shard, int(r)), t) for r, t in zip(rows, texts))
    return docs


def substring_dedup(cfg: SubstringDedupConfig, stage_files: Sequence[Path], counts: Sequence[int],
                    considered: np.ndarray, sizes: np.ndarray, work: Path) -> SubstringResult:
    """Find the cuts among the `considered` documents (bool per global document) of the work shards
    and write them as `removal_path(work, shard)` files; `sizes` are the documents' UTF-8 bytes.
    Files of a complete earlier run of this directory are read back instead."""
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    marker = {"shards": len(stage_files), "documents": int(considered.sum()), "min_tokens": cfg.min_tokens,
              "domains": list(cfg.domains)}
    done = work / DONE_FILE
    removed = np.zeros(int(offsets[-1]), dtype=np.int64)
    pieces = spans = 0
    reused = done.exists() and {k: v for k, v in read_json(done).items() if k in marker} == marker
    if reused:
        for shard in range(len(stage_files)):
            rows = load_removals(removal_path(work, shard))
            removed[offsets[shard]:offsets[shard + 1]] = removed_per_row(rows, int(counts[shard]))
            spans += len(rows)
    else:
        done.unlink(missing_ok=True)
        scratch = work / "substr-scratch"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        per_shard: list[list[tuple[int, int, int, int]]] = [[] for _ in stage_files]
        piece_tokens = max(1, (cfg.memory_mb << 20) // BYTES_PER_TOKEN)
        for found in repeated_spans(_stage_docs(stage_files, offsets, considered), cfg.min_tokens, piece_tokens,
                                    scratch, cfg.memory_mb << 20):
            pieces += 1
            for (shard, row), text, doc_spans in found:
                for start, end in _cuts(text, doc_spans):
                    nbytes = _utf8(text[start:end])
                    per_shard[shard].append((row, start, end, nbytes))
                    removed[offsets[shard] + row] += nbytes
        for shard, rows in enumerate(per_shard):
            spans += len(rows)
            with atomic_open(removal_path(work, shard), "wb") as f:
                np.save(f, np.array(rows, dtype=np.int64).reshape(-1, 4))
        atomic_write_json(done, {**marker, "spans": spans, "pieces": pieces})  # last: the stage is complete
        shutil.rmtree(scratch, ignore_errors=True)
    return SubstringResult(removed, considered & (removed >= sizes) & (removed > 0), spans, pieces, reused)


def record_stage(stats: StageStats, cols: dict, considered: np.ndarray, result: SubstringResult) -> None:
    """The report's `substring_dedup` row: per domain and source, documents and bytes before and after
    the cuts; a dropped document counts under `emptied_by_cuts`."""
    after = cols["nbytes"] - result.removed_bytes
    for group, key in (("by_domain", "domain"), ("by_source", "source")):
        values = cols[key]
        for value in np.unique(values[considered]):
            sel = considered & (values == value)
            stats.add_cell("substring_dedup", group, str(value), int(sel.sum()), int(cols["nbytes"][sel].sum()),
                           int((sel & ~result.emptied).sum()), int(after[sel & ~result.emptied].sum()),
                           "emptied_by_cuts")
    stats.count("substring_dedup", "spans_cut", result.spans)
    stats.count("substring_dedup", "documents_cut", int((considered & (result.removed_bytes > 0)).sum()))


def report_section(cfg: SubstringDedupConfig, cols: dict, result: SubstringResult | None) -> dict:
    """report.json's `dedup.substring`: the settings, the cuts, and the bytes cut per domain and source."""
    if result is None:
        return {"enabled": False}
    cut_docs = result.removed_bytes > 0
    section = {"enabled": True, "min_tokens": cfg.min_tokens, "domains": list(cfg.domains), "pieces": result.pieces,
               "reused": result.reused, "spans": result.spans, "documents_cut": int(cut_docs.sum()),
               "removed_docs": int(result.emptied.sum()), "removed_bytes": int(result.removed_bytes.sum())}
    for group, key in (("by_domain", "domain"), ("by_source", "source")):
        section[f"removed_bytes_{group}"] = {str(v): int(result.removed_bytes[cols[key] == v].sum())
                                             for v in np.unique(cols[key][cut_docs])}
    return section


def markdown_lines(section: dict) -> list[str]:
    if not section.get("enabled"):
        return []
    by_source = ", ".join(f"{k} {v / 1e6:,.2f} MB" for k, v in section["removed_bytes_by_source"].items())
    return [f"- exact substrings (>= {section['min_tokens']} tokens, {', '.join(section['domains'])}): "
            f"{section['spans']:,} spans cut from {section['documents_cut']:,} documents, "
            f"{section['removed_bytes'] / 1e6:,.2f} MB; {section['removed_docs']:,} documents emptied and dropped"
            + (f"; by source: {by_source}" if by_source else "")]
