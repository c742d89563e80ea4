"""Benchmark contamination by word 13-grams: lm-evaluation-harness's rule, 64-bit hashes, bounded memory.

    index = NgramIndex(["Question: Which gas do plants take in? ...", ...])   # one text per item
    hits = index.probe(training_texts)          # [(text index, item index), ...] every overlap
    mask = index.overlaps(training_texts)       # bool per text: shares at least one 13-gram

The promise: an item and a document overlap exactly when some 13 consecutive words of the item
also occur consecutively in the document, words being lm-eval's (`decontamination/janitor.py`):
ASCII letters lower-cased, `string.punctuation` deleted, split on whitespace. Items with fewer
than 13 words have no 13-gram and can never count as contaminated (lm-eval's rule too); they are
listed in `index.unchecked`. Each n-gram is one 64-bit hash (the words by `data.hashing.hash_words`,
windows by `window_hashes`, finished by `fmix64`, all vectorised), so an accidental match needs a
64-bit collision (about n_item_ngrams x n_training_ngrams / 2^64: none in practice).

Memory: the items' hashes are one sorted array (8 bytes an n-gram); training text is probed a batch
at a time by the caller (`probe` holds one batch's hashes), so a corpus larger than RAM streams.

`item_text(item)` is the text of a benchmark item that is checked: its zero-shot context (no
few-shot examples) followed by the gold continuation; for a generative item, the prompt and its
reference answer. The curation stage (`data curate` with `decontaminate.tasks = [...]`) drops
training documents that share a 13-gram with any item of the given tasks: `decontaminate_stage`.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from groundup.benchmarks import resolve_tasks
from groundup.data.hashing import fmix64, hash_words, window_hashes

NGRAM = 13  # lm-eval's (and GPT-3's) decontamination n-gram
_TABLE = str.maketrans(string.ascii_lowercase + string.ascii_uppercase, string.ascii_lowercase * 2,
                       string.punctuation)


def normalize(text: str) -> str:
    """lm-eval's Janitor.normalize_string: ASCII lower-cased, ASCII punctuation deleted."""
    return text.translate(_TABLE)


def words(text: str) -> list[str]:
    return normalize(text).split()


def ngram_hashes(texts: Sequence[str], n: int = NGRAM) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, owner): the 64-bit hash of every word n-gram of every text and the text it is in.

    All texts are hashed in one `hash_words` call; windows that would cross from one text into the
    next are dropped. Repeated n-grams of a text are kept (callers dedupe when they need a set)."""
    if n < 1:
        raise ValueError(f"n = {n}: expected at least 1")
    joined = [" ".join(normalize(t).split()) for t in texts]
    counts = np.array([j.count(" ") + 1 if j else 0 for j in joined], dtype=np.int64)
    total = int(counts.sum())
    if total < n:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    data = " ".join(j for j in joined if j).encode("utf-8", errors="surrogatepass")
    h, _ = hash_words(data)
    assert len(h) == total, (len(h), total)
    owner = np.repeat(np.arange(len(texts), dtype=np.int64), counts)
    first_word = np.repeat(np.cumsum(counts) - counts, counts)
    starts = np.arange(total - n + 1)
    valid = starts - first_word[: total - n + 1] + n <= counts[owner[: total - n + 1]]
    return fmix64(window_hashes(h, n)[valid]), owner[: total - n + 1][valid]


class NgramIndex:
    """The n-grams of a set of items, to probe training text against."""

    def __init__(self, texts: Sequence[str], n: int = NGRAM):
        self.n = n
        self.size = len(texts)
        hashes, owner = ngram_hashes(texts, n)
        pairs = np.unique(np.stack([hashes, owner.astype(np.uint64)], axis=1), axis=0) if len(hashes) else \
            np.zeros((0, 2), dtype=np.uint64)
        self.keys, self.first = np.unique(pairs[:, 0], return_index=True)  # sorted distinct hashes
        self.owners = pairs[:, 1].astype(np.int64)  # items, grouped by hash in `keys` order
        self.bounds = np.append(self.first, len(pairs))
        has = np.zeros(len(texts), dtype=bool)
        has[self.owners] = True
        self.unchecked = np.flatnonzero(~has).tolist()  # items with fewer than n words

    @property
    def ngrams(self) -> int:
        return len(self.keys)

    def _hits(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(key index, text index) of every training n-gram found among the items' n-grams."""
        if not len(self.keys):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        hashes, owner = ngram_hashes(texts, self.n)
        at = np.minimum(np.searchsorted(self.keys, hashes), len(self.keys) - 1)
        found = self.keys[at] == hashes
        return at[found], owner[found]

    def overlaps(self, texts: Sequence[str]) -> np.ndarray:
        """Per text, whether it shares at least one n-gram with any item."""
        _, docs = self._hits(texts)
        mask = np.zeros(len(texts), dtype=bool)
        mask[docs] = True
        return mask

    def probe(self, texts: Sequence[str]) -> list[tuple[int, int]]:
        """Every distinct (text index, item index) pair that shares an n-gram, sorted."""
        keys, docs = self._hits(texts)
        if not len(keys):
            return []
        pairs = np.unique(np.stack([keys, docs], axis=1), axis=0)
        out = set()
        for key, doc in pairs.tolist():
            for item in self.owners[self.bounds[key]: self.bounds[key + 1]].tolist():
                out.add((doc, item))
        return sorted(out)


# ----------------------------------------------------------------------------- benchmark items


def item_text(item) -> str:
    """The text of one task item that contamination checks (see the module docstring)."""
    if hasattr(item, "prompt"):  # GenItem
        return item.prompt + (" " + item.target if item.target else "")
    requests = item.requests()
    context, continuation = requests[min(item.gold, len(requests) - 1)]
    return context + continuation


def task_texts(tasks: str | Iterable[str], limit: int | None = None) -> list[tuple[str, list[str], list[str]]]:
    """(task name, item ids, item texts) per task of a spec (names, groups, custom .toml files),
    zero-shot; reads the eval task layer (groundup.benchmarks)."""

    spec = tasks if isinstance(tasks, str) else ",".join(tasks)
    out = []
    for task in resolve_tasks(spec):
        items = task.items(limit=limit, num_fewshot=0)
        out.append((task.name, [i.id for i in items], [item_text(i) for i in items]))
    return out


# ----------------------------------------------------------------------------- the curation stage


def decontaminate_stage(cfg, stage_files: Sequence[Path], counts: Sequence[int], alive: np.ndarray,
                        stats=None) -> np.ndarray:
    """The keep mask after dropping every alive document that shares an n-gram with an item of
    `cfg.tasks` (reading each work shard's text once). Removed documents are added to `stats` as
    examples of the "decontaminate" stage, with the task and item they overlap."""
    import pyarrow.parquet as pq

    per_task = task_texts(cfg.tasks, cfg.limit)
    names, ids, texts = [], [], []
    for name, item_ids, item_texts in per_task:
        names += [name] * len(item_ids)
        ids += item_ids
        texts += item_texts
    index = NgramIndex(texts, cfg.ngram)
    keep = alive.copy()
    offset = 0
    for path, count in zip(stage_files, counts):
        rows = np.flatnonzero(alive[offset: offset + count])
        if len(rows):
            table = pq.read_table(path, columns=["id", "source", "domain", "text"]).take(rows)
            docs = table.to_pylist()
            hits = index.probe([d["text"] for d in docs])
            first: dict[int, int] = {}
            for doc, item in hits:
                first.setdefault(doc, item)
            for doc, item in first.items():
                keep[offset + rows[doc]] = False
                if stats is not None:
                    d = docs[doc]
                    stats.add_example("decontaminate", {"id": d["id"], "source": d["source"], "domain": d["domain"],
                                                        "reason": f"overlaps {ids[item]} ({names[item]})",
                                                        "snippet": d["text"]})
            if stats is not None and first:
                for task in {names[i] for i in first.values()}:
                    stats.count("decontaminate", f"docs_overlapping:{task}",
                                sum(1 for i in first.values() if names[i] == task))
        offset += count
    if stats is not None:
        stats.count("decontaminate", "items", len(texts))
        stats.count("decontaminate", "item_ngrams", index.ngrams)
    return keep
