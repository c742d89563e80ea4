"""Exact substring dedup benchmark: planted boilerplate paragraphs removed, the rest kept.

    python benchmarks/substring_dedup.py [--chunk-chars 3000] [--templates 40] [--memory-mb 256] > substring.json

Pages: the embedded Shakespeare, cut at paragraph breaks into pages of about --chunk-chars
characters. Boilerplate: --templates paragraphs of 60-150 words (at least 65 tokens, so every one
qualifies for min_tokens 50) drawn (seeded) from the corpus's own vocabulary in random order (cookie
banners and footers in spirit: text no page has by itself); 70% of pages get one to three different
templates at random paragraph breaks, so each template is shared by many pages. The pages go through `groundup.data.pipeline.curate` with substring dedup on
(min_tokens 50) and the prose filters off (they would only drop pages; exact and MinHash dedup stay
on). The cuts are read from the run's `.work/substr-NNNNN.npy` files and compared with where the
templates sit in each page: the share of planted bytes cut (target >= 95%) and of all other bytes cut
(target < 1%: text that genuinely repeats, such as lines both editions of a play share, counts here).
Peak memory is the process's peak resident set (the whole curation, in one process).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from groundup.config import from_dict
from groundup.corpus import iter_corpus
from groundup.data.curate_config import CurateConfig
from groundup.data.pipeline import curate


def utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def build_pages(chunk_chars: int, templates: int, seed: int) -> tuple[list[dict], list[str]]:
    rng = random.Random(seed)
    pages = [r["text"] for r in iter_corpus(["text"], chunk_chars=chunk_chars)]
    vocab = sorted({w for t in pages[:300] for w in t.split() if w.isalpha()})
    pool = []
    for _ in range(templates):
        words = [rng.choice(vocab) for _ in range(rng.randint(60, 150))]
        sentences = [" ".join(words[i:i + 12]).capitalize() + "." for i in range(0, len(words), 12)]
        pool.append(" ".join(sentences))
    records = []
    for i, text in enumerate(pages):
        planted = rng.sample(range(templates), rng.randint(1, 3)) if rng.random() < 0.7 else []
        paragraphs = text.split("\n\n")
        for t in planted:
            paragraphs.insert(rng.randint(0, len(paragraphs)), pool[t])
        records.append({"id": f"page-{i:05d}", "source": f"site-{i % 7}", "text": "\n\n".join(paragraphs),
                        "planted": planted})
    return records, pool


def overlap_bytes(text: str, spans: list[tuple[int, int]], ranges: list[tuple[int, int]]) -> int:
    total = 0
    for a, b in spans:
        for c, d in ranges:
            lo, hi = max(a, c), min(b, d)
            if lo < hi:
                total += utf8(text[lo:hi])
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk-chars", type=int, default=3000)
    p.add_argument("--templates", type=int, default=40)
    p.add_argument("--memory-mb", type=int, default=256)
    p.add_argument("--min-tokens", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    records, pool = build_pages(args.chunk_chars, args.templates, args.seed)
    planted_by_id = {r["id"]: r.pop("planted") for r in records}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "pages.jsonl"
        with open(inputs, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        cfg = from_dict(CurateConfig, {"filters": {"text": []}, "dedup": {"substring": {
            "enabled": True, "min_tokens": args.min_tokens, "memory_mb": args.memory_mb}}})
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        started = time.perf_counter()
        report = curate([inputs], Path(tmp) / "out", cfg, progress=False)
        seconds = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        work = Path(tmp) / "out" / ".work"
        planted_total = planted_cut = other_total = other_cut = missing = 0
        for stage in sorted(work.glob("stage-*.parquet")):
            table = pq.read_table(stage, columns=["id", "text"]).to_pydict()
            cuts = np.load(work / stage.name.replace("stage-", "substr-").replace(".parquet", ".npy"))
            by_row: dict[int, list[tuple[int, int]]] = {}
            for r, s, e, _ in cuts.tolist():
                by_row.setdefault(r, []).append((s, e))
            for row, (doc_id, text) in enumerate(zip(table["id"], table["text"])):
                spans = by_row.get(row, [])
                ranges = []
                for t in planted_by_id[doc_id]:
                    at = text.find(pool[t])
                    if at < 0:
                        missing += 1
                        continue
                    ranges.append((at, at + len(pool[t])))
                planted = sum(utf8(text[a:b]) for a, b in ranges)
                cut_planted = overlap_bytes(text, spans, ranges)
                cut_all = sum(utf8(text[a:b]) for a, b in spans)
                planted_total += planted
                planted_cut += cut_planted
                other_total += utf8(text) - planted
                other_cut += cut_all - cut_planted
    stage = next(s for s in report["stages"] if s["name"] == "substring_dedup")
    sub = report["dedup"]["substring"]
    print(json.dumps({
        "docs": len(records), "mb": round(sum(utf8(r["text"]) for r in records) / 1e6, 2),
        "templates": len(pool), "planted_occurrences": sum(len(v) for v in planted_by_id.values()),
        "planted_bytes": planted_total, "planted_removed_share": round(planted_cut / planted_total, 5),
        "other_bytes": other_total, "other_removed_bytes": other_cut,
        "other_removed_share": round(other_cut / other_total, 5), "planted_not_found": missing,
        "min_tokens": args.min_tokens, "memory_mb": args.memory_mb, "pieces": sub["pieces"], "spans": sub["spans"],
        "documents_emptied": sub["removed_docs"], "exact_dedup_removed_docs": report["dedup"]["exact"]["removed_docs"],
        "substring_stage_s": round(stage["seconds"], 2), "curate_total_s": round(seconds, 2),
        "peak_rss_mb": round(peak, 1), "rss_before_curate_mb": round(rss_before, 1),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }, indent=1))


if __name__ == "__main__":
    main()
