"""MinHash, LSH bucketing, union-find clustering, exact dedup, mixing and the quality classifier."""

from __future__ import annotations

import random

import numpy as np
import pytest

from groundup.data.classifier import QualityClassifier, auc, train
from groundup.data.curate_config import MinHashConfig, MixingConfig
from groundup.data.dedup import UnionFind, buckets_for, deduplicate
from groundup.data.minhash import MinHasher, collision_probability, shingle_hashes
from groundup.data.mixing import assign_copies, plan_mix

VOCAB = [f"w{i}" for i in range(5000)]


def essay(rng: random.Random, n: int = 400) -> list[str]:
    return rng.choices(VOCAB, k=n)


def jaccard(a: str, b: str, n: int = 5) -> float:
    sa, sb = set(shingle_hashes(a, n).tolist()), set(shingle_hashes(b, n).tolist())
    return len(sa & sb) / len(sa | sb)


def test_minhash_estimates_jaccard():
    rng = random.Random(0)
    words = essay(rng, 2000)
    other = words[:1700] + essay(rng, 300)
    a, b = " ".join(words), " ".join(other)
    hasher = MinHasher(MinHashConfig(bands=32, rows=8))
    sig = hasher.signatures([shingle_hashes(a, 5), shingle_hashes(b, 5)])
    estimate = float((sig[0] == sig[1]).mean())
    assert abs(estimate - jaccard(a, b)) < 0.08


def test_minhash_finds_a_planted_near_duplicate_and_keeps_distinct_documents_apart():
    rng = random.Random(1)
    docs = [essay(rng) for _ in range(30)]
    original = docs[7]
    edited = original[:360] + essay(rng, 40)  # 10% of the words changed (the ending rewritten)
    near_b = list(original)
    for i in rng.sample(range(len(near_b)), 4):  # 1% of words changed, scattered
        near_b[i] = "changed"
    texts = [" ".join(d) for d in docs] + [" ".join(edited), " ".join(near_b)]
    assert jaccard(texts[7], texts[30]) > 0.8
    keys = MinHasher(MinHashConfig()).keys_for_texts(texts)
    shares = (keys[:, None, :] == keys[None, :, :]).any(axis=2)
    assert shares[7, 30] and shares[7, 31]
    np.fill_diagonal(shares, False)
    assert shares[:30, :30].sum() == 0  # unrelated documents never collide


def test_scattered_word_changes_are_found_with_word_unigrams():
    # 10% of words changed at random positions breaks half the 5-grams (Jaccard ~0.4, rightly not a
    # near-duplicate at 5-grams); over single words the sets stay 80% similar and are found.
    rng = random.Random(2)
    words = essay(rng, 600)
    changed = list(words)
    for i in rng.sample(range(len(words)), 60):
        changed[i] = f"new{i}"
    keys = MinHasher(MinHashConfig(ngram=1)).keys_for_texts([" ".join(words), " ".join(changed), " ".join(essay(rng, 600))])
    assert (keys[0] == keys[1]).any() and not (keys[0] == keys[2]).any()


def test_collision_probability_matches_the_lsh_formula():
    assert collision_probability(0.8, 14, 8) == pytest.approx(0.924, abs=1e-3)
    assert collision_probability(0.5, 14, 8) < 0.06


def test_union_find_is_transitive_and_roots_at_the_smallest():
    uf = UnionFind(6)
    uf.union_all(np.array([4, 2]))
    uf.union_all(np.array([2, 5]))
    uf.union_all(np.array([1, 3]))
    assert uf.roots().tolist() == [0, 1, 2, 1, 2, 2]


def _write_shards(tmp_path, exact_parts, band_parts):
    exact_files, band_files = [], []
    for i, (e, b) in enumerate(zip(exact_parts, band_parts)):
        exact_files.append(tmp_path / f"exact-{i}.npy")
        band_files.append(tmp_path / f"bands-{i}.npy")
        np.save(exact_files[-1], np.array(e, dtype=np.uint64))
        np.save(band_files[-1], np.array(b, dtype=np.uint64).reshape(len(b), -1))
    return exact_files, band_files


def test_exact_and_near_dedup_across_shards_keep_the_first(tmp_path):
    # shard 0: docs 0, 1, 2; shard 1: docs 3, 4. 3 repeats 0's text; 4 shares a band with 1.
    exact = [[10, 11, 12], [10, 14]]
    bands = [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 4]]]
    ef, bf = _write_shards(tmp_path, exact, bands)
    alive = np.ones(5, dtype=bool)
    result = deduplicate(ef, bf, [3, 2], alive, alive, True, True, bands=2, memory_mb=1)
    assert result.exact_duplicate.tolist() == [False, False, False, True, False]
    assert result.near_duplicate.tolist() == [False, False, False, False, True]
    assert [c.tolist() for c in result.clusters] == [[1, 4]]
    assert result.exact_groups == 1


def test_bucketed_passes_give_the_same_clusters(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    n, bands = 400, 4
    keys = rng.integers(1, 50, size=(n, bands)).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    ef, bf = _write_shards(tmp_path, [np.arange(200) + 1, np.arange(200) + 1000], [keys[:200], keys[200:]])
    alive = np.ones(n, dtype=bool)
    one = deduplicate(ef, bf, [200, 200], alive, alive, True, True, bands, memory_mb=1)
    monkeypatch.setattr("groundup.data.dedup.buckets_for", lambda n_docs, memory_mb: 8)
    many = deduplicate(ef, bf, [200, 200], alive, alive, True, True, bands, memory_mb=1)
    assert np.array_equal(one.near_duplicate, many.near_duplicate)
    assert [c.tolist() for c in one.clusters] == [c.tolist() for c in many.clusters]
    assert buckets_for(10_000_000, 64) == 3


def test_mixing_plan_reaches_the_target_shares_within_the_repeat_cap():
    available = {"code": 600, "text": 300, "math": 100}
    plan = plan_mix(available, MixingConfig(weights={"code": 0.55, "text": 0.25, "math": 0.2}, max_repeats=4))
    achieved = {d: plan.rates[d] * b for d, b in available.items()}
    total = sum(achieved.values())
    for d, w in (("code", 0.55), ("text", 0.25), ("math", 0.2)):
        assert achieved[d] / total == pytest.approx(w)
    assert max(plan.rates.values()) <= 4
    capped = plan_mix(available, MixingConfig(weights={"code": 0.1, "math": 0.9}, max_repeats=2))
    assert capped.rates["math"] == pytest.approx(2.0) and capped.rates["text"] == 0.0
    assert any("lowered" in n for n in capped.notes) and any("text" in n for n in capped.notes)
    rng = np.random.default_rng(0)
    domains = np.array(["code"] * 5 + ["text"] * 40 + ["math"] * 400)
    sizes = rng.integers(10, 2000, size=len(domains))  # a few large code files, many small problems
    alive = rng.random(len(domains)) > 0.1
    available = {d: int(sizes[alive & (domains == d)].sum()) for d in ("code", "text", "math")}
    plan = plan_mix(available, MixingConfig(weights={"code": 0.55, "text": 0.25, "math": 0.2}))
    copies = assign_copies(plan, domains, sizes, alive, seed=0, max_repeats=4)
    assert not copies[~alive].any() and copies.max() <= 4
    out = {d: int((copies * sizes)[domains == d].sum()) for d in available}
    total = sum(out.values())
    for d, w in (("code", 0.55), ("text", 0.25), ("math", 0.2)):
        assert abs(out[d] - w * total) <= sizes.max()  # within one document of the target
    assert np.array_equal(copies, assign_copies(plan, domains, sizes, alive, seed=0, max_repeats=4))


def test_quality_classifier_learns_heldout_accuracy_auc_and_round_trips(tmp_path):
    rng = random.Random(0)
    good_words = "the river runs past the old mill where children play each summer evening".split()
    bad_words = "click buy now free offer limited deal win prize cheap subscribe".split()
    good = [" ".join(rng.choices(good_words, k=60)) for _ in range(150)]
    bad = [" ".join(rng.choices(bad_words, k=60)) for _ in range(150)]
    model = train(good, bad, epochs=5, seed=0)
    assert model.metrics["heldout_accuracy"] >= 0.95 and model.metrics["heldout_auc"] >= 0.95
    model.save(tmp_path / "q.npz")
    loaded = QualityClassifier.load(tmp_path / "q.npz")
    assert np.allclose(loaded.score(good[:3] + bad[:3]), model.score(good[:3] + bad[:3]), atol=1e-5)
    assert auc(np.array([1, 1, 0, 0]), np.array([0.9, 0.8, 0.1, 0.8])) == pytest.approx(0.875)
