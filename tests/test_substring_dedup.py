"""Exact substring dedup (data/substring_dedup.py): the cuts equal a brute-force reference (every token
window of N that occurs twice anywhere, all occurrences, merged) for one piece and for many; a span
repeated across two suffix-array pieces is found through `curate` with a tiny memory_mb; a restart
reuses the cut files; the report's counts per source; the exact output of a 3-document run; the
config errors; and `--executor ray` writes the same bytes as the local run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from groundup.config import from_dict
from groundup.data.curate_config import CurateConfig
from groundup.data.pipeline import curate
from groundup.data.substring_dedup import TOKEN_RE, repeated_spans
from groundup.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def reference_spans(texts: list[str], n: int) -> dict[int, list[tuple[int, int]]]:
    """Brute force: every window of n tokens counted over the whole corpus; a token is cut when a
    window occurring twice or more covers it; cuts run from a first token's start to a last token's end."""
    tokens = [TOKEN_RE.findall(t) for t in texts]
    seen = Counter(tuple(t[i:i + n]) for t in tokens for i in range(len(t) - n + 1))
    out = {}
    for d, (text, toks) in enumerate(zip(texts, tokens)):
        cut = [False] * len(toks)
        for i in range(len(toks) - n + 1):
            if seen[tuple(toks[i:i + n])] >= 2:
                cut[i:i + n] = [True] * n
        bounds = [m.span() for m in TOKEN_RE.finditer(text)]
        spans, i = [], 0
        while i < len(toks):
            if cut[i]:
                j = i
                while j < len(toks) and cut[j]:
                    j += 1
                spans.append((bounds[i][0], bounds[j - 1][1]))
                i = j
            else:
                i += 1
        if spans:
            out[d] = spans
    return out


def found_spans(texts: list[str], n: int, piece_tokens: int, scratch: Path, buckets: int | None) -> tuple[dict, int]:
    scratch.mkdir()
    found, pieces = {}, 0
    for piece in repeated_spans(lambda: enumerate(texts), n, piece_tokens, scratch, 1 << 20, buckets):
        pieces += 1
        found.update({key: spans for key, _, spans in piece})
    return found, pieces


def test_tokens_are_words_punctuation_runs_and_single_cjk_characters():
    assert TOKEN_RE.findall("Hello,  world... foo_bar 3.14 日本語 ไทย") == [
        "Hello", ",", "world", "...", "foo_bar", "3", ".", "14", "日", "本", "語", "ไ", "ท", "ย"]


def test_cuts_equal_the_brute_force_reference_on_random_corpora(tmp_path):
    rng = random.Random(0)
    multi = 0
    for trial in range(150):
        words = ["a", "b", "c", "dé", ".", ",", "xy", "日"][: rng.randint(2, 8)]
        texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(rng.randint(1, 9))]
        n, piece_tokens = rng.randint(1, 7), rng.choice([1, 7, 30, 10_000])
        found, pieces = found_spans(texts, n, piece_tokens, tmp_path / str(trial), rng.choice([None, 1, 3, 16]))
        assert found == reference_spans(texts, n), (texts, n, piece_tokens)
        multi += pieces > 1
    assert multi > 50  # the cross-piece path ran in most trials


def _write(path: Path, records: list[dict]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return path


def _config(**substring) -> CurateConfig:
    dedup = {"minhash": {"enabled": False}, "substring": {"enabled": True, **substring}}
    return from_dict(CurateConfig, {"filters": {"text": []}, "pii": {"enabled": False}, "dedup": dedup,
                                    "output": {"format": "jsonl", "shuffle": False, "shard_docs": 2}})


def _output(out: Path) -> dict[str, str]:
    rows = [json.loads(line) for p in sorted((out / "shards").glob("part-*")) for line in p.read_text().splitlines()]
    return {r["id"]: r["text"] for r in rows}


def _random_words(rng: random.Random, count: int) -> str:
    return " ".join(f"w{rng.randrange(10**9)}" for _ in range(count))


def test_a_span_repeated_across_two_pieces_is_found_with_a_tiny_memory_mb(tmp_path):
    rng = random.Random(1)
    span = _random_words(rng, 60)
    texts = [_random_words(rng, 3000) for _ in range(8)]  # 24k tokens: memory_mb=1 holds 16k a piece
    texts[0] = texts[0] + " " + span
    texts[7] = span + " " + texts[7]
    inputs = _write(tmp_path / "in.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    report = curate([inputs], tmp_path / "out", _config(min_tokens=50, memory_mb=1), progress=False)
    assert report["dedup"]["substring"]["pieces"] >= 2
    assert report["dedup"]["substring"]["spans"] == 2
    expected = {f"d{i}": t for i, t in enumerate(texts)}
    expected["d0"] = texts[0][: -len(span)]  # the space before the cut stays
    expected["d7"] = texts[7][len(span):]
    assert _output(tmp_path / "out") == expected


DOCS = [
    {"id": "a", "source": "forum", "text": "Hello there! Cookies help us deliver our services to you. Bye now."},
    {"id": "b", "source": "blog", "text": "Bonjour été? Cookies help us deliver our services to you; merci."},
    {"id": "c", "source": "blog", "text": "Welcome. Cookies help us deliver our services to you; see you."},
]
COOKIES = "Cookies help us deliver our services to you"  # 8 tokens


def test_three_documents_come_out_exactly_as_expected(tmp_path):
    report = curate([_write(tmp_path / "in.jsonl", DOCS)], tmp_path / "out", _config(min_tokens=5), progress=False)
    # The 8 tokens are in all three; "our services to you ;" (5 tokens) in b and c only, so their ";"
    # goes too; "! Cookies ..." and "you . Bye" occur once. The whitespace around a cut stays.
    assert _output(tmp_path / "out") == {"a": "Hello there! . Bye now.", "b": "Bonjour été?  merci.",
                                         "c": "Welcome.  see you."}
    assert report["dedup"]["substring"]["spans"] == 3


def test_a_document_left_with_only_whitespace_is_dropped_and_counted_by_source(tmp_path):
    docs = [*DOCS[:2], {"id": "c", "source": "blog", "text": f" {COOKIES} \n"}]
    report = curate([_write(tmp_path / "in.jsonl", docs)], tmp_path / "out", _config(min_tokens=5), progress=False)
    assert _output(tmp_path / "out") == {"a": "Hello there! . Bye now.", "b": "Bonjour été? ; merci."}
    stage = next(s for s in report["stages"] if s["name"] == "substring_dedup")
    cut, emptied = len(COOKIES), len(docs[2]["text"])
    blog_in = len(docs[1]["text"].encode()) + emptied
    assert len(docs[1]["text"].encode()) == len(docs[1]["text"]) + 2  # each "é" is two bytes: bytes are counted
    assert stage["by_source"]["blog"] == {"docs_in": 2, "bytes_in": blog_in, "docs_out": 1,
                                          "bytes_out": blog_in - cut - emptied, "reasons": {"emptied_by_cuts": 1}}
    assert stage["by_source"]["forum"]["bytes_in"] - stage["by_source"]["forum"]["bytes_out"] == cut
    sub = report["dedup"]["substring"]
    assert sub["removed_bytes_by_source"] == {"blog": cut + emptied, "forum": cut}
    assert (sub["removed_docs"], sub["documents_cut"], stage["extra"]["spans_cut"]) == (1, 3, 3)
    assert report["totals"]["docs_kept"] == 2 and report["totals"]["bytes_out"] == sum(
        len(t.encode()) for t in _output(tmp_path / "out").values())


def test_a_restart_reuses_the_cut_files(tmp_path):
    inputs = _write(tmp_path / "in.jsonl", DOCS)
    out = tmp_path / "out"
    curate([inputs], out, _config(min_tokens=5), progress=False)
    files = sorted((out / ".work").glob("substr-*"))
    assert [f.name for f in files] == ["substr-00000.npy", "substr-00001.npy", "substr-done.json"]
    stamps = {f: f.stat().st_mtime_ns for f in files}
    first = _output(out)
    for part in (out / "shards").glob("part-*"):
        part.unlink()
    report = curate([inputs], out, _config(min_tokens=5), progress=False)
    assert {f: f.stat().st_mtime_ns for f in files} == stamps
    assert (report["dedup"]["substring"]["reused"], report["dedup"]["substring"]["pieces"]) == (True, 0)
    assert _output(out) == first
    rows = np.load(out / ".work" / "substr-00000.npy")  # row, start, end, bytes
    assert rows.tolist() == [[0, 13, 56, 43], [1, 13, 57, 44]]
    assert pq.read_table(out / ".work" / "stage-00000.parquet", columns=["text"])["text"][1].as_py()[13:57] == \
        COOKIES + ";"


@pytest.mark.parametrize("key, value, message", [
    ("min_tokens", 0, "dedup.substring.min_tokens = 0: expected at least 1"),
    ("memory_mb", 0, "dedup.substring.memory_mb = 0: expected at least 1"),
    ("domains", [], "dedup.substring.domains = []: expected at least one domain (or enabled = false)"),
    ("min_token", 5, "unknown key 'dedup.substring.min_token' (did you mean 'dedup.substring.min_tokens'?)"),
])
def test_config_errors_name_the_key(key, value, message):
    with pytest.raises(ConfigError) as err:
        from_dict(CurateConfig, {"dedup": {"substring": {"enabled": True, key: value}}})
    assert str(err.value).startswith(message)


def test_the_ray_executor_writes_the_same_bytes(tmp_path):
    pytest.importorskip("ray")
    rng = random.Random(2)
    span = _random_words(rng, 60)
    records = [{"id": f"d{i}", "text": _random_words(rng, 200) + (" " + span if i % 2 else "")} for i in range(12)]
    inputs = _write(tmp_path / "in.jsonl", records)
    args = ["data", "curate", "--input", str(inputs), "--no-progress", "dedup.substring.enabled=true",
            "output.shard_docs=4", "filters.text=[]"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    for executor in ("local", "ray"):  # each in a child process: a Ray driver must not be pytest itself
        argv = args + ["--out", str(tmp_path / executor), "--executor", executor]
        code = f"import sys; from groundup.cli import main; sys.exit(main({argv!r}))"
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    parts = {e: {p.name: p.read_bytes() for p in sorted((tmp_path / e / "shards").glob("part-*"))}
             for e in ("local", "ray")}
    assert parts["local"] == parts["ray"] and len(parts["local"]) == 3
    assert json.loads((tmp_path / "ray" / "report.json").read_text())["dedup"]["substring"]["spans"] == 6
