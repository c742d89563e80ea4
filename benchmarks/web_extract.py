"""HTML-to-text quality and speed: each `data extract` backend, next to trafilatura called directly.

Quality is scrapinghub's article-extraction-benchmark metric (4-token shingles of `\\w+` tokens;
precision averaged over pages with a prediction, recall over pages with a truth, F1 of the two means)
against the hand-made ground truth of `groundup.corpus.web_pages.make_pages` (no public set of real pages
with full-text ground truth ships in a PyPI package: trafilatura's and goose3's sdists carry test pages
but no reference texts). Speed is one process, one page at a time, the configured time-out sandbox
included; MB/s counts the pages' HTML as UTF-8.

    .venv/bin/python benchmarks/web_extract.py 300
"""

from __future__ import annotations

import argparse
import json
import time

from groundup.corpus.web_pages import make_pages
from groundup.data.web.extract import BACKENDS, ExtractConfig, Extractor, mean_scores


def _timed(fn, pages) -> tuple[list[str], float]:
    start = time.perf_counter()
    texts = [fn(p.html) or "" for p in pages]
    return texts, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int, nargs="?", default=300, help="number of pages")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pages = make_pages(args.n, seed=args.seed)
    truths = [p.truth for p in pages]
    megabytes = sum(len(p.html.encode("utf-8")) for p in pages) / 1e6
    result = {"pages": len(pages), "html_mb": round(megabytes, 3), "seed": args.seed, "backends": {}}

    def row(texts: list[str], seconds: float, **extra) -> dict:
        scores = mean_scores(zip(texts, truths))
        return {**{k: round(v, 4) for k, v in scores.items()}, "pages_per_s": round(len(pages) / seconds, 1),
                "mb_per_s": round(megabytes / seconds, 2), "empty": sum(not t for t in texts), **extra}

    for backend in BACKENDS:
        extractor = Extractor(ExtractConfig(backend=backend))  # imports the backend outside the timing
        texts, seconds = _timed(lambda html: (lambda e: e.text if e else "")(extractor(html)), pages)
        result["backends"][backend] = row(texts, seconds, skipped=dict(extractor.counts))
        extractor.close()

    import trafilatura
    from trafilatura.deduplication import LRU_TEST

    LRU_TEST.clear()  # the direct call's dedup cache starts empty, like each backend's own
    texts, seconds = _timed(lambda html: trafilatura.extract(html, favor_precision=True, include_comments=False,
                                                             deduplicate=True), pages)
    result["trafilatura_direct"] = row(texts, seconds)
    result["trafilatura_f1_gap"] = round(abs(result["backends"]["trafilatura"]["f1"]
                                             - result["trafilatura_direct"]["f1"]), 4)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
