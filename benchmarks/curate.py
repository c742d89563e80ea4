"""Curation benchmark: our MinHash LSH against datasketch, our Gopher filters against datatrove.

    python benchmarks/curate.py [--chunk-chars 5000] [--limit N] > curate.json

Needs the `bench` extra (datasketch, datatrove, and spacy, which datatrove's English word
tokenizer uses). Documents: the embedded Shakespeare and standard-library corpus, cut into chunks
of about --chunk-chars characters.

(a) MinHash, word 5-grams, 14 bands x 8 rows (112 permutations) on both sides. The documents get
    --planted near-copies whose endings are rewritten (0-20% of words), so true pairs span the
    interesting range. True pairs (Jaccard >= 0.8) are found exactly on a sample: an inverted
    index over shingles proposes every pair that shares a shingle held by at most 200 sampled
    documents (a pair with Jaccard >= 0.8 shares hundreds of shingles, nearly all of them rare)
    and each proposed pair's Jaccard is then computed from the two shingle sets. A pair counts as
    found when the two documents share an LSH bucket (ours: a band key; datasketch: `query`).
    Speed: text to LSH index, documents per second (CPU time, one run each after a warm-up on 50
    documents), tokenisation included on both sides.
(b) Gopher quality and repetition on every document, each filter run on every document (no short
    cut), datatrove's and ours; agreement of keep/remove decisions, per filter and both together.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import time

import numpy as np

from groundup.corpus import iter_corpus
from groundup.data.curate_config import GopherQualityConfig, GopherRepetitionConfig, MinHashConfig
from groundup.data.gopher import gopher_quality, gopher_repetition
from groundup.data.minhash import MinHasher, collision_probability, shingle_hashes
from groundup.data.words import split_words

WORDS = re.compile(r"\w+")


def corpus(chunk_chars: int, limit: int | None) -> list[str]:
    texts = [r["text"] for r in iter_corpus(["text", "code"], chunk_chars=chunk_chars)]
    return texts[:limit] if limit else texts


def plant(texts: list[str], count: int, rng: random.Random) -> tuple[list[str], list[tuple[int, int]]]:
    """Near-copies: the last 0-20% of an original's words rewritten with words from elsewhere."""
    vocab = [w for t in texts[:200] for w in t.split()]
    out, pairs = list(texts), []
    candidates = [i for i, t in enumerate(texts) if len(t.split()) >= 200]
    for i in rng.sample(candidates, min(count, len(candidates))):
        words = texts[i].split()
        keep = int(len(words) * (1 - rng.uniform(0.0, 0.2)))
        out.append(" ".join(words[:keep] + rng.choices(vocab, k=len(words) - keep)))
        pairs.append((i, len(out) - 1))
    return out, pairs


def true_pairs(texts: list[str], sample: list[int], threshold: float = 0.8, max_df: int = 200) -> list[tuple]:
    sets = {i: shingle_hashes(texts[i], 5) for i in sample}
    ids = np.concatenate([sets[i] for i in sample])
    docs = np.concatenate([np.full(len(sets[i]), i, dtype=np.int64) for i in sample])
    order = np.argsort(ids, kind="stable")
    ids, docs = ids[order], docs[order]
    bounds = np.flatnonzero(np.diff(ids)) + 1
    candidates = set()
    for group in np.split(docs, bounds):
        if 2 <= len(group) <= max_df:
            g = sorted(set(group.tolist()))
            candidates.update((a, b) for k, a in enumerate(g) for b in g[k + 1:])
    out = []
    for a, b in candidates:
        sa, sb = set(sets[a].tolist()), set(sets[b].tolist())
        j = len(sa & sb) / len(sa | sb)
        if j >= threshold:
            out.append((a, b, j))
    return out


def _datasketch_index(texts: list[str], cfg: MinHashConfig):
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(num_perm=cfg.bands * cfg.rows, params=(cfg.bands, cfg.rows))
    sketches = []
    for i, text in enumerate(texts):
        words = WORDS.findall(text.lower())
        shingles = {" ".join(words[k:k + 5]).encode() for k in range(max(1, len(words) - 4))}
        m = MinHash(num_perm=cfg.bands * cfg.rows, seed=cfg.seed)
        m.update_batch(list(shingles))
        lsh.insert(i, m)
        sketches.append(m)
    return lsh, sketches


def _our_index(texts: list[str], hasher: MinHasher) -> np.ndarray:
    keys = hasher.keys_for_texts(texts)
    for band in range(hasher.cfg.bands):  # the LSH index: documents grouped by equal band keys
        np.unique(keys[:, band], return_inverse=True)
    return keys


def bench_minhash(texts: list[str], pairs: list[tuple]) -> dict:
    cfg = MinHashConfig()
    hasher = MinHasher(cfg)
    _our_index(texts[:50], hasher)  # both sides warm up (imports, first allocations) on 50 documents
    _datasketch_index(texts[:50], cfg)
    t = time.process_time()
    keys = _our_index(texts, hasher)
    ours_s = time.process_time() - t
    t = time.process_time()
    lsh, sketches = _datasketch_index(texts, cfg)
    theirs_s = time.process_time() - t
    ours_found = sum(bool((keys[a] == keys[b]).any()) for a, b, _ in pairs)
    theirs_found = sum(b in lsh.query(sketches[a]) for a, b, _ in pairs)
    expected = float(np.mean([collision_probability(j, cfg.bands, cfg.rows) for _, _, j in pairs])) if pairs else None
    return {
        "documents": len(texts), "true_pairs": len(pairs),
        "true_pair_jaccard_min": round(min(j for *_, j in pairs), 3) if pairs else None,
        "recall": round(ours_found / len(pairs), 4) if pairs else None,
        "recall_datasketch": round(theirs_found / len(pairs), 4) if pairs else None,
        "recall_expected_from_lsh_formula": round(expected, 4) if expected is not None else None,
        "docs_per_s": round(len(texts) / ours_s, 1), "docs_per_s_datasketch": round(len(texts) / theirs_s, 1),
        "speedup": round(theirs_s / ours_s, 2), "target_recall": 0.95, "target_speedup": 5.0,
    }


def bench_gopher(texts: list[str]) -> dict:
    from datatrove.data import Document
    from datatrove.pipeline.filters.gopher_quality_filter import GopherQualityFilter
    from datatrove.pipeline.filters.gopher_repetition_filter import GopherRepetitionFilter

    quality_cfg, repetition_cfg = GopherQualityConfig(), GopherRepetitionConfig()
    t = time.process_time()
    ours = []
    for text in texts:
        words = split_words(text)
        ours.append((gopher_quality(text, words, quality_cfg) is None,
                     gopher_repetition(text, words, repetition_cfg) is None))
    ours_s = time.process_time() - t
    quality, repetition = GopherQualityFilter(), GopherRepetitionFilter()
    t = time.process_time()
    theirs = []
    for i, text in enumerate(texts):
        doc = Document(text=text, id=str(i))
        theirs.append((quality.filter(doc) is True, repetition.filter(doc) is True))
    theirs_s = time.process_time() - t
    n = len(texts)
    return {
        "documents": n,
        "agreement": round(sum(a == b for a, b in zip(ours, theirs)) / n, 5),
        "agreement_quality": round(sum(a[0] == b[0] for a, b in zip(ours, theirs)) / n, 5),
        "agreement_repetition": round(sum(a[1] == b[1] for a, b in zip(ours, theirs)) / n, 5),
        "kept_quality": sum(a[0] for a in ours), "kept_repetition": sum(a[1] for a in ours),
        "docs_per_s": round(n / ours_s, 1), "docs_per_s_datatrove": round(n / theirs_s, 1),
        "speedup": round(theirs_s / ours_s, 2), "target_agreement": 0.99, "target_speedup": 2.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk-chars", type=int, default=5000)
    p.add_argument("--limit", type=int, default=None, help="at most this many corpus chunks")
    p.add_argument("--planted", type=int, default=300)
    p.add_argument("--sample", type=int, default=1500, help="extra random documents in the exact-Jaccard sample")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-gopher", action="store_true")
    args = p.parse_args()
    rng = random.Random(args.seed)
    texts = corpus(args.chunk_chars, args.limit)
    with_copies, planted = plant(texts, args.planted, rng)
    sample = sorted({i for pair in planted for i in pair} | set(rng.sample(range(len(texts)), min(args.sample, len(texts)))))
    result = {
        "benchmark": "curate", "machine": f"{platform.machine()}, {platform.python_implementation()} "
                                          f"{platform.python_version()}", "chunk_chars": args.chunk_chars,
        "minhash": bench_minhash(with_copies, true_pairs(with_copies, sample)),
    }
    if not args.skip_gopher:
        result["gopher"] = bench_gopher(texts)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
