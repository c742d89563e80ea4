"""`groundup eval contamination`: which benchmark items occur in the training data, by 13-gram overlap.

    report = contamination(["out/curated"], "arc_easy,gsm8k")        # or token shards, JSONL, Parquet
    report["tasks"]["arc_easy"]        # {items, contaminated, share, unchecked, examples: [{item, docs}]}
    report["records"]["arc_easy"][0]   # {id, contaminated, n_docs, doc_ids}

An item is contaminated when any word 13-gram of its text (its zero-shot context and gold answer;
`data.decontaminate.item_text`) also occurs in a training document, words normalised by
lm-evaluation-harness's decontamination rule (data/decontaminate.py). The items' n-gram hashes are
one sorted array; the training data streams through in chunks of about `chunk_chars` characters,
each hashed and probed and then dropped, so memory does not grow with the corpus (only the
matching document ids are kept, at most `max_ids` per item, all of them counted).

Training data, per path: a token shard directory (`data tokenize`'s; every split, each document
decoded with its tokenizer, found from the index or given), a curated directory (`data curate`'s
OUT: its shards/), or anything `data.iter_records` reads (JSONL, Parquet, text files, directories).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, Sequence

from groundup.data import ReadStats, iter_records
from groundup.data.decontaminate import NGRAM, NgramIndex, task_texts
from groundup.errors import DataError
from groundup.tokenizer import load_tokenizer
from groundup.tokens.shards import open_split, read_index, shards_tokenizer


def _shard_tokenizer(shard_dir: Path, index: dict, tokenizer):
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
        if tok.hash != index.get("tokenizer_hash"):
            raise DataError(f"{shard_dir}: token shards were made by tokenizer {index.get('tokenizer_hash')}, "
                            f"not by the given one ({tok.hash})")
        return tok

    found = shards_tokenizer(shard_dir, index)
    if found is None:
        raise DataError(f"{shard_dir}: the tokenizer that made these shards ({index.get('tokenizer') or 'unnamed'}) "
                        "was not found; pass it with --tokenizer")
    return found


def _shard_texts(shard_dir: Path, tokenizer) -> Iterator[tuple[str, str]]:
    import json

    index = read_index(shard_dir)
    tok = _shard_tokenizer(shard_dir, index, tokenizer)
    eot = index.get("eot_id")
    for split in index["splits"]:
        for f in open_split(shard_dir, split, index):
            with open(f.ids_path, encoding="utf-8") as ids:
                for d in range(f.documents):
                    doc_id = json.loads(ids.readline() or '""') or f"{split}#{f.first_doc + d}"
                    toks = f.tokens[f.starts[d]: f.starts[d + 1]]
                    if len(toks) and toks[-1] == eot:
                        toks = toks[:-1]
                    yield doc_id, tok.decode(toks)


def iter_training_texts(paths: Sequence[str | Path], tokenizer=None, read_stats=None) -> Iterator[tuple[str, str]]:
    """(document id, text) of every training document under `paths`, streamed."""

    stats = read_stats if read_stats is not None else ReadStats()
    for p in map(Path, paths):
        if not p.exists():
            raise DataError(f"training data not found: {p}")
        if (p / "index.json").is_file():
            yield from _shard_texts(p, tokenizer)
            continue
        source = p / "shards" if (p / "shards").is_dir() and (p / "report.json").is_file() else p
        for record in iter_records([source], stats):
            yield record["id"], record["text"]


def contamination(data: Sequence[str | Path], tasks: str, *, limit: int | None = None, tokenizer=None,
                  ngram: int = NGRAM, max_ids: int = 10, chunk_chars: int = 16 << 20,
                  progress: Callable[[int], None] | None = None) -> dict:
    """The contamination report (see the module docstring) and per-item records under "records"."""

    per_task = task_texts(tasks, limit)
    names, ids, texts = [], [], []
    for name, item_ids, item_texts in per_task:
        names += [name] * len(item_ids)
        ids += item_ids
        texts += item_texts
    index = NgramIndex(texts, ngram)
    n_docs = [0] * len(texts)
    doc_ids: list[list[str]] = [[] for _ in texts]
    stats = ReadStats()
    documents = chars = 0
    chunk_ids: list[str] = []
    chunk_texts: list[str] = []
    size = 0

    def flush():
        for doc, item in index.probe(chunk_texts):
            n_docs[item] += 1
            if len(doc_ids[item]) < max_ids:
                doc_ids[item].append(chunk_ids[doc])
        if progress is not None:
            progress(len(chunk_texts))
        chunk_ids.clear()
        chunk_texts.clear()

    for doc_id, text in iter_training_texts(data, tokenizer, stats):
        chunk_ids.append(str(doc_id))
        chunk_texts.append(text)
        documents += 1
        chars += len(text)
        size += len(text)
        if size >= chunk_chars:
            flush()
            size = 0
    if chunk_texts:
        flush()
    if documents == 0:
        raise DataError(f"no training documents found in {', '.join(map(str, data))}")
    unchecked = set(index.unchecked)
    report: dict = {"data": [str(p) for p in data], "documents": documents, "characters": chars, "ngram": ngram,
                    "rule": "an item is contaminated when any word n-gram of its zero-shot text and gold answer "
                            "occurs in a training document (lm-eval's normalisation: ASCII lower-cased, "
                            "punctuation deleted, whitespace-split)",
                    "item_ngrams": index.ngrams, "tasks": {}, "records": {}}
    if any(getattr(stats, k, 0) for k in ("bad_json", "no_text", "unreadable_files", "binary_files")):
        report["read_problems"] = stats.summary()
    start = 0
    for name, item_ids, _ in per_task:
        rows = range(start, start + len(item_ids))
        start += len(item_ids)
        records = [{"id": ids[i], "contaminated": n_docs[i] > 0, "n_docs": n_docs[i], "doc_ids": doc_ids[i],
                    "checked": i not in unchecked} for i in rows]
        hit = [r for r in records if r["contaminated"]]
        report["tasks"][name] = {
            "items": len(records), "contaminated": len(hit),
            "share": len(hit) / len(records) if records else float("nan"),
            "unchecked": sum(1 for r in records if not r["checked"]),
            "examples": [{"item": r["id"], "n_docs": r["n_docs"], "docs": r["doc_ids"]} for r in hit[:10]],
        }
        report["records"][name] = records
    return report


def render_contamination(report: dict) -> str:
    rows = [("task", "items", "contaminated", "share", "unchecked (< n words)")]
    for name, t in report["tasks"].items():
        rows.append((name, str(t["items"]), str(t["contaminated"]), f"{100 * t['share']:.1f}%", str(t["unchecked"])))
    widths = [max(len(r[k]) for r in rows) for k in range(5)]
    lines = ["  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for name, t in report["tasks"].items():
        for ex in t["examples"][:3]:
            more = f" (+{ex['n_docs'] - len(ex['docs'])} more)" if ex["n_docs"] > len(ex["docs"]) else ""
            lines.append(f"  {ex['item']}: in {', '.join(ex['docs'][:5])}{more}")
    return "\n".join(lines)
