"""How well a tokenizer compresses text: bytes per token by domain, vocabulary use, longest tokens.

    stats = tokenizer_stats(tok, records)     # records: dicts with text (and domain)
    print(format_stats(stats))

Bytes per token is the number that matters for a model's cost (more bytes per token: fewer steps
per byte of text). Measure it on text the tokenizer was not trained on: `tokenizer train` holds out
a share of documents for exactly this and stores their statistics in the tokenizer's metadata.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from groundup.tokenizer.base import BaseTokenizer
from groundup.tokenizer.parallel import map_batches


def _batched_texts(records: Iterable[dict], domains: list[str], batch_bytes: int) -> Iterator[list[str]]:
    texts, size = [], 0
    for record in records:
        texts.append(record["text"])
        domains.append(record.get("domain") or "text")
        size += len(record["text"])
        if size >= batch_bytes:
            yield texts
            texts, size = [], 0
    if texts:
        yield texts


def tokenizer_stats(tok: BaseTokenizer, records: Iterable[dict], workers: int = 0, longest: int = 10,
                    batch_bytes: int = 1 << 20) -> dict:
    """Bytes per token per domain (and overall), share of the vocabulary used, the longest tokens."""
    domains: list[str] = []
    per: dict[str, dict] = {}
    counts = np.zeros(tok.vocab_size, dtype=np.int64)
    token_bytes = tok.token_bytes()
    done = 0
    for arrays in map_batches(tok, _batched_texts(records, domains, batch_bytes), workers=workers):
        for ids in arrays:
            entry = per.setdefault(domains[done], {"documents": 0, "bytes": 0, "tokens": 0})
            entry["documents"] += 1
            entry["tokens"] += len(ids)
            entry["bytes"] += int(token_bytes[ids].sum())
            done += 1
        if arrays:
            counts += np.bincount(np.concatenate(arrays), minlength=tok.vocab_size)
    total = {k: sum(e[k] for e in per.values()) for k in ("documents", "bytes", "tokens")}
    for entry in [*per.values(), total]:
        entry["bytes_per_token"] = round(entry["bytes"] / entry["tokens"], 4) if entry["tokens"] else None
    ordinary = np.ones(tok.vocab_size, dtype=bool)  # specials need not sit at the end (Llama 2's <s> is 1)
    ordinary[list(tok.special_token_ids)] = False
    used = (counts > 0) & ordinary
    by_length = sorted(np.flatnonzero(ordinary).tolist(), key=lambda i: (-int(token_bytes[i]), i))[:longest]
    return {
        "tokenizer_hash": tok.hash,
        "vocab_size": tok.vocab_size,
        "domains": dict(sorted(per.items())),
        "total": total,
        "vocab_used": int(used.sum()),
        "vocab_used_share": round(float(used.sum() / max(1, ordinary.sum())), 4),
        "longest_tokens": [{"id": i, "bytes": int(token_bytes[i]), "count": int(counts[i]),
                            "text": tok.id_to_bytes(i).decode("utf-8", "replace")} for i in by_length],
    }


def format_stats(stats: dict) -> str:
    lines = [f"{'domain':<12} {'documents':>10} {'bytes':>14} {'tokens':>12} {'bytes/token':>12}"]
    for name, e in [*stats["domains"].items(), ("all", stats["total"])]:
        bpt = f"{e['bytes_per_token']:.3f}" if e["bytes_per_token"] is not None else "-"
        lines.append(f"{name:<12} {e['documents']:>10,} {e['bytes']:>14,} {e['tokens']:>12,} {bpt:>12}")
    lines.append(f"vocabulary used: {stats['vocab_used']:,} of {stats['vocab_size']:,} "
                 f"({100 * stats['vocab_used_share']:.1f}% of the non-special tokens)")
    lines.append("longest tokens: " + ", ".join(f"{t['text']!r} ({t['bytes']} B, seen {t['count']:,}x)"
                                                for t in stats["longest_tokens"]))
    return "\n".join(lines)
