"""SimHash against MinHash on the same corpus: what each finds, SimHash's recall and precision, speed.

    python benchmarks/simhash_recall.py [--chunk-chars 3000] [--limit N] [--planted 600] [--k 3,4,6,8,10,12] > out.json

Documents: the embedded Shakespeare and standard-library corpus, cut into chunks of about
--chunk-chars characters, plus --planted near-copies of randomly chosen chunks with controlled
edit rates: for each rate in --rates, copies whose words are each replaced with that probability by
a random corpus word ("scatter", the hardest case for word n-grams: each edit touches n shingles)
and copies whose last rate-fraction of words is rewritten ("tail", as benchmarks/curate.py plants).

Both methods run as curation runs them: MinHash band keys (14 x 8) or SimHash fingerprints per
shard (`keys_for_texts`, the per-shard cost), written as `bands-NNNNN.npy` shards of 2,000
documents, then `dedup.deduplicate` (the global pass: buckets, union-find, keep-first). A pair
"found" by a method is two documents in the same cluster of its result.

Reported per method: clusters, same-cluster pairs, documents removed, CPU seconds and docs/s of
each part. For SimHash at each k: recall and precision of its pairs (and of its removed-document
decisions) against MinHash's, and recall against the planted pairs overall and per kind and edit
rate, with precision against the truth: the corpus has real near-duplicates of its own (e.g. the
near-identical codec modules of the standard library), so a found pair counts as true when it was
planted or when its exact word 5-gram Jaccard similarity is at least --true-jaccard (0.5: related
text; MinHash's 14 x 8 bands target 0.8). MinHash's own numbers are given beside SimHash's.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from groundup.corpus import iter_corpus
from groundup.data.curate_config import MinHashConfig, SimHashConfig
from groundup.data.dedup import deduplicate
from groundup.data.minhash import MinHasher, shingle_hashes
from groundup.data.simhash import SimHasher

SHARD_DOCS = 2000


def plant(texts: list[str], count: int, rates: list[float], rng: random.Random) -> tuple[list[str], list[tuple]]:
    """Near-copies of random chunks: (original, copy, kind, rate) for each, kinds and rates in turn."""
    vocab = [w for t in texts[:300] for w in t.split()]
    out, planted = list(texts), []
    candidates = [i for i, t in enumerate(texts) if len(t.split()) >= 100]
    combos = [(kind, rate) for kind in ("scatter", "tail") for rate in rates]
    for n, i in enumerate(rng.sample(candidates, min(count, len(candidates)))):
        kind, rate = combos[n % len(combos)]
        words = texts[i].split()
        if kind == "scatter":
            words = [rng.choice(vocab) if rng.random() < rate else w for w in words]
        else:
            keep = int(round(len(words) * (1 - rate)))
            words = words[:keep] + rng.choices(vocab, k=len(words) - keep)
        out.append(" ".join(words))
        planted.append((i, len(out) - 1, kind, rate))
    return out, planted


def run_method(name: str, texts: list[str], hasher, width: int, simhash_k: int | None, work: Path) -> dict:
    hasher.keys_for_texts(texts[:50])  # warm-up: imports, first allocations
    files = []
    t0 = time.process_time()
    for s in range(0, len(texts), SHARD_DOCS):
        keys = hasher.keys_for_texts(texts[s:s + SHARD_DOCS])
        assert keys.shape[1] == width
        files.append(work / f"{name}-bands-{s // SHARD_DOCS:05d}.npy")
        np.save(files[-1], keys)
    keys_s = time.process_time() - t0
    counts = [min(SHARD_DOCS, len(texts) - s) for s in range(0, len(texts), SHARD_DOCS)]
    n = len(texts)
    t0 = time.process_time()
    result = deduplicate([], files, counts, np.ones(n, bool), np.ones(n, bool), False, True,
                         MinHashConfig().bands, 256, simhash_k)
    dedup_s = time.process_time() - t0
    pairs = {(int(a), int(b)) for c in result.clusters for x, a in enumerate(c) for b in c[x + 1:]}
    pairs = {(min(p), max(p)) for p in pairs}
    return {"result": result, "pairs": pairs, "stats": {
        "clusters": len(result.clusters), "pairs": len(pairs), "removed_docs": int(result.near_duplicate.sum()),
        "keys_cpu_s": round(keys_s, 3), "dedup_cpu_s": round(dedup_s, 3),
        "docs_per_s_keys": round(n / keys_s, 1), "docs_per_s": round(n / (keys_s + dedup_s), 1)}}


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


class Truth:
    """Planted pairs, and the exact Jaccard similarity of any other pair (shingle sets cached)."""

    def __init__(self, texts: list[str], planted: list[tuple], threshold: float):
        self.texts, self.threshold = texts, threshold
        self.planted = {(o, c) for o, c, _, _ in planted}
        self.sets: dict[int, np.ndarray] = {}

    def _set(self, i: int) -> np.ndarray:
        if i not in self.sets:
            self.sets[i] = shingle_hashes(self.texts[i], 5)
        return self.sets[i]

    def true(self, pair: tuple[int, int]) -> bool:
        if pair in self.planted:
            return True
        a, b = self._set(pair[0]), self._set(pair[1])
        both = len(np.intersect1d(a, b, assume_unique=True))
        return both / (len(a) + len(b) - both) >= self.threshold

    def scores(self, pairs: set) -> dict:
        right = sum(map(self.true, pairs))
        return {"recall_vs_planted": _ratio(len(pairs & self.planted), len(self.planted)),
                "precision_vs_truth": _ratio(right, len(pairs)), "false_pairs": len(pairs) - right}


def compare(found: dict, reference: dict, truth: Truth, planted: list[tuple]) -> dict:
    p, ref = found["pairs"], reference["pairs"]
    removed, ref_removed = found["result"].near_duplicate, reference["result"].near_duplicate
    by_rate: dict[str, list[int]] = {}
    for orig, copy, kind, rate in planted:
        cell = by_rate.setdefault(f"{kind} {rate}", [0, 0])
        cell[0] += (orig, copy) in p
        cell[1] += 1
    return {
        "recall_vs_minhash_pairs": _ratio(len(p & ref), len(ref)),
        "precision_vs_minhash_pairs": _ratio(len(p & ref), len(p)),
        "recall_vs_minhash_removed": _ratio(int((removed & ref_removed).sum()), int(ref_removed.sum())),
        "precision_vs_minhash_removed": _ratio(int((removed & ref_removed).sum()), int(removed.sum())),
        **truth.scores(p),
        "planted_recall_by_edit": {k: round(v[0] / v[1], 3) for k, v in sorted(by_rate.items())},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk-chars", type=int, default=3000)
    p.add_argument("--limit", type=int, default=None, help="at most this many corpus chunks")
    p.add_argument("--planted", type=int, default=600)
    p.add_argument("--rates", default="0.002,0.005,0.01,0.02,0.05,0.1", help="edit rates, comma-separated")
    p.add_argument("--k", default="3,4,6,8,10,12", help="SimHash distances to try, comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--simhash-ngram", type=int, default=5, help="SimHash's shingle length (MinHash keeps 5)")
    p.add_argument("--true-jaccard", type=float, default=0.5, help="a found pair this similar is a true one")
    args = p.parse_args()
    rng = random.Random(args.seed)
    texts = [r["text"] for r in iter_corpus(["text", "code"], chunk_chars=args.chunk_chars)]
    if args.limit:
        texts = rng.sample(texts, min(args.limit, len(texts)))
    texts, planted = plant(texts, args.planted, [float(r) for r in args.rates.split(",")], rng)
    truth = Truth(texts, planted, args.true_jaccard)  # originals are distinct chunks: each group is one pair
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        minhash = run_method("minhash", texts, MinHasher(MinHashConfig()), MinHashConfig().bands, None, work)
        out = {"benchmark": "simhash_recall", "machine": f"{platform.machine()}, {platform.python_implementation()} "
                                                         f"{platform.python_version()}",
               "documents": len(texts), "planted_pairs": len(planted), "chunk_chars": args.chunk_chars,
               "minhash": {"bands": MinHashConfig().bands, "rows": MinHashConfig().rows, **minhash["stats"],
                           **truth.scores(minhash["pairs"]),
                           "planted_recall_by_edit": compare(minhash, minhash, truth,
                                                             planted)["planted_recall_by_edit"]},
               "simhash": {}}
        hasher = SimHasher(SimHashConfig(ngram=args.simhash_ngram))
        out["simhash_ngram"] = args.simhash_ngram
        for k in (int(x) for x in args.k.split(",")):
            found = run_method(f"simhash{k}", texts, hasher, 1, k, work)
            out["simhash"][f"k={k}"] = {**found["stats"], **compare(found, minhash, truth, planted)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
