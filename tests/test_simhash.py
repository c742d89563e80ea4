"""SimHash near-duplicate detection (data/simhash.py): the fingerprint against a slow reference of
Charikar's definition, the pigeonhole candidates against all pairs, bucketing against one bucket,
curation with `dedup.near = "simhash"` (local, and Ray with the same bytes), and its config errors."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from groundup.config import load_config
from groundup.corpus import iter_corpus
from groundup.data.curate_config import CurateConfig, SimHashConfig
from groundup.data.dedup import cluster, deduplicate
from groundup.data.minhash import shingle_batch
from groundup.data.pipeline import curate
from groundup.data.simhash import (SimHasher, block_values, blocks, bucket_entries, candidate_pairs, hamming,
                                   pairs_in_bucket)
from groundup.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
M64 = (1 << 64) - 1


def _fmix64(x: int) -> int:
    """splitmix64's finaliser on a Python int (the reference does not reuse hashing.fmix64)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def reference_fingerprint(shingles: list[int], seed: int) -> int:
    """Charikar: bit i is set iff the sum over shingles of +1 (bit i of the seeded shingle hash set)
    or -1 (not set) is positive."""
    mix = _fmix64((seed * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) & M64)
    g = np.array([_fmix64(h ^ mix) for h in shingles], dtype=np.uint64)
    sums = [2 * int(((g >> np.uint64(i)) & np.uint64(1)).sum()) - len(g) for i in range(64)]
    return sum(1 << i for i in range(64) if sums[i] > 0)


def test_fingerprint_equals_the_reference_definition():
    rng = np.random.default_rng(0)
    vocab = ["the", "king", "is", "dead", "long", "live", "queen", "x", "y", "zz"]
    texts = [" ".join(rng.choice(vocab, size=int(rng.integers(0, 60)))) for _ in range(60)]
    texts += ["", "one two", "Ünïcode wörds here and there again"]
    texts.append(" ".join(rng.choice(vocab + ["ab", "cd"], size=140_000)))  # spans three blocks of 65,535 shingles
    texts.append("x")
    for seed in (1, 7):
        got = SimHasher(SimHashConfig(seed=seed)).fingerprints_for_texts(texts)
        shingles, offsets = shingle_batch(texts, 5)
        want = [reference_fingerprint([int(h) for h in shingles[offsets[d]:offsets[d + 1]]], seed)
                for d in range(len(texts))]
        assert got.tolist() == want
    assert got[60] == 0  # no shingles: no fingerprint
    assert len({int(f) for f in got[:60]}) > 50  # fingerprints differ from document to document


def test_similar_texts_are_few_bits_apart_and_others_about_half():
    words = [r["text"] for r in itertools.islice(iter_corpus(["text"], chunk_chars=3000), 3)]
    edited = words[0].replace(words[0].split()[-3], "EDITED", 1)
    fps = SimHasher(SimHashConfig()).fingerprints_for_texts([words[0], edited, words[1], words[2]])
    assert hamming(fps[0:1], fps[1:2])[0] <= 3
    assert 20 <= hamming(fps[0:1], fps[2:3])[0] <= 44 and 20 <= hamming(fps[1:2], fps[3:4])[0] <= 44


def _random_fingerprints(rng, bases: int = 60, variants: int = 5) -> np.ndarray:
    """Random fingerprints and, for each, variants with 0-8 random bits flipped (exact copies too)."""
    base = rng.integers(0, 2**64, bases, dtype=np.uint64, endpoint=False)
    out = [base]
    for _ in range(variants):
        flips = np.zeros(bases, dtype=np.uint64)
        for j in range(bases):
            for bit in rng.choice(64, size=int(rng.integers(0, 9)), replace=False):
                flips[j] |= np.uint64(1) << np.uint64(bit)
        out.append(base ^ flips)
    return np.concatenate(out)


def _brute_force(fps: np.ndarray, k: int) -> set[tuple[int, int]]:
    n = len(fps)
    i, j = np.triu_indices(n, 1)
    close = hamming(fps[i], fps[j]) <= k
    return set(zip(i[close].tolist(), j[close].tolist()))


@pytest.mark.parametrize("k", [0, 3, 6])
def test_block_candidates_equal_all_pairs_brute_force(k):
    fps = _random_fingerprints(np.random.default_rng(k))
    fps = np.append(fps, np.array([M64 ^ 1, M64, M64], dtype=np.uint64))  # a pair that sorts last
    ids = np.arange(len(fps))
    found = set()
    for block in range(k + 1):
        found |= set(map(tuple, candidate_pairs(block_values(fps, k, block), fps, ids, k).tolist()))
    want = _brute_force(fps, k)
    assert found == want and len(want) > (20 if k else 5)
    assert sum(w for _, w in blocks(k)) == 64 and len(blocks(k)) == k + 1


def _write_shards(tmp_path: Path, fps: np.ndarray, cuts: list[int]) -> tuple[list[Path], np.ndarray]:
    files = []
    for s, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(fps)])):
        files.append(tmp_path / f"bands-{s:05d}.npy")
        np.save(files[-1], fps[a:b].reshape(-1, 1))
    return files, np.array([0, *cuts, len(fps)], dtype=np.int64)


def _components(n: int, pairs: set[tuple[int, int]]) -> list[list[int]]:
    _, clusters = cluster(n, (np.array(p) for p in pairs))
    return sorted(c.tolist() for c in clusters)


@pytest.mark.parametrize("k", [3, 6])
def test_bucketed_passes_give_the_clusters_of_one_bucket_and_of_all_pairs(tmp_path, k):
    fps = _random_fingerprints(np.random.default_rng(10 + k))
    fps[5] = 0  # no fingerprint: never clustered
    files, offsets = _write_shards(tmp_path, fps, [100, 250])
    live = np.ones(len(fps), dtype=bool)
    live[7] = False  # removed by an earlier stage
    want = _components(len(fps), {(a, b) for a, b in _brute_force(fps, k) if live[a] and live[b] and 5 not in (a, b)})
    assert len(want) > 20
    for buckets in (1, 4, 16):
        groups = []
        held = 0
        for block in range(k + 1):
            for bucket in range(buckets):
                members, sizes = pairs_in_bucket(files, offsets, live, k, block, bucket, buckets)
                assert (sizes == 2).all()
                groups += list(members.reshape(-1, 2))
                held = max(held, len(bucket_entries(files, offsets, live, k, block, bucket, buckets)[0]))
        assert sorted(c.tolist() for c in cluster(len(fps), groups)[1]) == want
        assert held <= (len(fps) - 2 if buckets == 1 else len(fps) // 2)  # a pass holds one bucket only
    # deduplicate() (the local executor) runs the same passes: the first of each cluster is kept
    result = deduplicate([], files, np.diff(offsets), live, np.ones(len(fps), bool), False, True, 14, 256, simhash_k=k)
    assert sorted(c.tolist() for c in result.clusters) == want
    assert np.flatnonzero(result.near_duplicate).tolist() == sorted(m for c in want for m in c[1:])


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Shakespeare chunks and stdlib files, a copy of chunk 8 with one word changed (its fingerprint
    1 bit away; a one-word edit of a 500-word chunk moves 1 to 5 bits), and math."""
    root = tmp_path_factory.mktemp("raw")
    text = list(itertools.islice(iter_corpus(["text"], chunk_chars=3000), 30))
    code = list(itertools.islice(iter_corpus(["code"]), 12))
    math = list(iter_corpus(["math"], math_count=40))
    words = text[8]["text"].rsplit(" ", 3)
    near = {**text[8], "id": "near-8", "source": "mirror", "text": f"{words[0]} altered {words[2]} {words[3]}"}
    for name, records in (("a-text.jsonl", text[:15]), ("b-text.jsonl", text[15:] + [near]), ("c-code.jsonl", code),
                          ("d-math.jsonl", math)):
        with open(root / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return root


SETTINGS = ["read.task_bytes=1", "output.shard_docs=10"]


def _ids(out: Path) -> set[str]:
    return {r["id"] for p in sorted((out / "shards").glob("part-*")) for r in pq.read_table(p).to_pylist()}


@pytest.fixture(scope="module")
def simhash_run(raw, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("simhash") / "curated"
    curate([raw], out, load_config(CurateConfig, None, [*SETTINGS, "dedup.near=simhash"]), progress=False)
    return out


def test_curation_with_simhash_removes_the_near_copy_and_keeps_distinct_documents(raw, simhash_run, tmp_path):
    off = tmp_path / "off"
    no_near = [*SETTINGS, "dedup.near=simhash", "dedup.simhash.enabled=false"]
    curate([raw], off, load_config(CurateConfig, None, no_near), progress=False)
    assert "near-8" in _ids(off)
    texts = [json.loads(line)["text"] for line in (raw / "a-text.jsonl").read_text().splitlines()[8:9]]
    texts.append(json.loads((raw / "b-text.jsonl").read_text().splitlines()[-1])["text"])
    fps = SimHasher(SimHashConfig()).fingerprints_for_texts(texts)
    assert hamming(fps[:1], fps[1:])[0] == 1  # within the default k: the copy must go
    assert _ids(simhash_run) == _ids(off) - {"near-8"}  # nothing else removed
    report = json.loads((simhash_run / "report.json").read_text())
    assert report["dedup"]["near"] == "simhash" and "minhash" not in report["dedup"]
    sh = report["dedup"]["simhash"]
    assert (sh["k"], sh["blocks"], sh["clusters"], sh["removed_docs"]) == (10, 11, 1, 1)  # the default k and its k + 1 blocks
    assert [(m["id"], m["kept"]) for m in sh["largest"][0]["members"]] == [(report_id(raw, 8), True), ("near-8", False)]
    stages = {s["name"]: s for s in report["stages"]}
    assert "simhash_dedup" in stages and "minhash_dedup" not in stages
    assert stages["simhash_dedup"]["by_source"]["mirror"]["reasons"] == {"near_duplicate": 1}
    assert "SimHash (64 bits, at most 10 apart, 11 blocks" in (simhash_run / "report.md").read_text()
    bands = np.load(simhash_run / ".work" / "bands-00000.npy")
    assert bands.shape[1] == 1 and bands.dtype == np.uint64  # one fingerprint column per shard


def report_id(raw: Path, index: int) -> str:
    return json.loads((raw / "a-text.jsonl").read_text().splitlines()[index])["id"]


def test_restart_reuses_the_fingerprints_and_writes_the_same_bytes(raw, simhash_run, tmp_path):
    out = tmp_path / "again"
    shutil.copytree(simhash_run, out)
    for p in (out / "shards").glob("part-*"):
        p.unlink()
    (out / "report.json").unlink()
    before = {p.name: p.stat().st_mtime_ns for p in (out / ".work").glob("bands-*.npy")}
    curate([raw], out, load_config(CurateConfig, None, [*SETTINGS, "dedup.near=simhash"]), progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in (out / ".work").glob("bands-*.npy")} == before
    assert _parts(out) == _parts(simhash_run)


def _parts(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "shards").glob("part-*"))}


DRIVER = """
import sys
import groundup.data.dedup
groundup.data.dedup.buckets_for = lambda n_docs, memory_mb: 3  # several buckets per block, as on a big corpus
from groundup.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ray_executor_writes_the_local_bytes_with_simhash(raw, tmp_path):
    pytest.importorskip("ray")
    outs = {}
    for executor in ("local", "ray"):
        outs[executor] = tmp_path / executor
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        done = subprocess.run([sys.executable, "-c", DRIVER, "data", "curate", "--input", str(raw), "--out",
                               str(outs[executor]), "--no-progress", "--executor", executor, *SETTINGS,
                               "dedup.near=simhash"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    assert _parts(outs["ray"]) == _parts(outs["local"]) and "near-8" not in _ids(outs["ray"])
    assert len(list((outs["ray"] / ".work" / "dedup").glob("block-*.npz"))) == 11 * 3  # k + 1 blocks x buckets


@pytest.mark.parametrize("override, message", [
    ("dedup.near=lsh", "dedup.near"),
    ("dedup.simhash.k=16", "dedup.simhash.k = 16: expected an integer from 0 to 15"),
    ("dedup.simhash.k=-1", "dedup.simhash.k = -1: expected an integer from 0 to 15"),
    ("dedup.simhash.ngram=0", "dedup.simhash.ngram = 0: expected at least 1"),
    ("dedup.simhash.memory_mb=0", "dedup.simhash.memory_mb = 0: expected at least 1"),
    ("dedup.simhash.bands=3", "dedup.simhash.bands"),
])
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(CurateConfig, None, [override])
    assert message in str(err.value)
