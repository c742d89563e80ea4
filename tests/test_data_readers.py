"""iter_records: formats, code directories, and bad input counted with file:line."""

from __future__ import annotations

import gzip
import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from groundup.data.readers import ReadStats, iter_records
from groundup.errors import DataError


def read(paths, **kwargs) -> tuple[list[dict], ReadStats]:
    stats = ReadStats()
    return list(iter_records(paths, stats, **kwargs)), stats


def test_text_markdown_jsonl_and_compressed(tmp_path):
    (tmp_path / "a.txt").write_text("plain text\n")
    (tmp_path / "b.md").write_text("# title\n")
    lines = [{"text": "one", "url": "https://x.test/1", "lang": "en"}, {"id": "given", "text": "two", "domain": "math"}]
    body = "".join(json.dumps(r) + "\n" for r in lines).encode()
    (tmp_path / "c.jsonl").write_bytes(body)
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(body))
    (tmp_path / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(body))
    records, stats = read([tmp_path])
    by_id = {r["id"]: r for r in records}
    assert by_id[f"{tmp_path.name}/a.txt"]["domain"] == "text"
    assert by_id["c:1"] == {"text": "one", "url": "https://x.test/1", "lang": "en", "id": "c:1", "source": "c",
                            "domain": "text"}
    assert by_id["given"]["domain"] == "math"
    assert {"d:1", "e:1"} <= set(by_id)
    assert stats.records == 8 and stats.files == 5


def test_parquet_rows_keep_their_columns(tmp_path):
    pq.write_table(pa.table({"text": ["alpha", None, "gamma"], "source": ["s", "s", "s"], "score": [1, 2, 3]}),
                   tmp_path / "t.parquet")
    pq.write_table(pa.table({"body": ["no text column"]}), tmp_path / "u.parquet")
    records, stats = read([tmp_path / "t.parquet", tmp_path / "u.parquet"])
    assert [(r["text"], r["score"], r["id"]) for r in records] == [("alpha", 1, "t:1"), ("gamma", 3, "t:3")]
    assert stats.no_text == 2
    assert any("u.parquet: no 'text' column" in e for e in stats.no_text_examples)


def test_code_directory_language_and_vendored_generated_minified(tmp_path):
    repo = tmp_path / "repo"
    for rel, body in {"src/app.py": "print(1)\n", "src/util.ts": "let x = 1;\n", "vendor/lib.py": "x = 1\n",
                      "web/app.min.js": "a();b();\n", "proto/msg_pb2.py": "X = 1\n", "README.md": "# hi\n",
                      ".git/config": "[core]\n", "Makefile": "all:\n", "logo.png": "\x89PNG\x00\x00"}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(body)
    records, stats = read([repo])
    by_id = {r["id"]: r for r in records}
    assert by_id["repo/src/app.py"]["domain"] == "code" and by_id["repo/src/app.py"]["language"] == "python"
    assert by_id["repo/src/util.ts"]["language"] == "typescript"
    assert by_id["repo/vendor/lib.py"]["vendored"] is True
    assert by_id["repo/web/app.min.js"]["minified"] is True
    assert by_id["repo/proto/msg_pb2.py"]["generated"] is True
    assert by_id["repo/README.md"]["domain"] == "text"
    assert not any(".git" in i for i in by_id)
    assert stats.unsupported_files == 1 and stats.binary_files == 1


def test_malformed_lines_are_skipped_and_reported_with_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": \n[1, 2]\n{"title": "no text"}\n\n{"text": "caf\xe9"}\n')
    records, stats = read([path])
    assert [r["text"] for r in records] == ["ok", "caf\ufffd"]
    assert stats.bad_json == 2 and stats.no_text == 1 and stats.invalid_utf8 == 1
    assert stats.bad_json_examples[0].startswith(f"{path}:2: invalid JSON")
    assert stats.bad_json_examples[1] == f"{path}:3: expected a JSON object, got list"
    assert stats.no_text_examples == [f"{path}:4: no string 'text' field"]
    assert stats.invalid_utf8_examples[0].startswith(f"{path}:6:")


def test_binary_files_are_skipped_and_counted(tmp_path):
    (tmp_path / "blob.txt").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / "ok.txt").write_text("fine")
    records, stats = read([tmp_path / "blob.txt", tmp_path / "ok.txt"])
    assert [r["text"] for r in records] == ["fine"]
    assert stats.binary_files == 1 and "blob.txt" in stats.binary_examples[0]


def test_empty_and_missing_input_raise_clear_errors(tmp_path):
    with pytest.raises(DataError, match="input not found"):
        read([tmp_path / "nope.jsonl"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no records found"):
        read([tmp_path / "empty"])
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(DataError, match=r"no records found.*bad.jsonl:1: invalid JSON"):
        read([tmp_path / "bad.jsonl"])


def test_a_ten_megabyte_line_is_read_and_an_oversized_one_skipped_in_bounded_memory(tmp_path):
    big = "word " * 2_000_000  # 10 MB of text on one line
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"text": big}) + "\n" + json.dumps({"text": "after"}) + "\n")
    records, stats = read([path])
    assert len(records[0]["text"]) == len(big) and records[1]["text"] == "after"
    tracemalloc.start()
    records, stats = read([path], max_record_bytes=1 << 20)  # over the limit: skipped in 1 MiB steps
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [r["text"] for r in records] == ["after"]
    assert stats.too_long == 1 and stats.too_long_examples[0].startswith(f"{path}:1:")
    assert peak < 8 << 20


def test_large_text_file_is_split_at_line_breaks(tmp_path):
    path = tmp_path / "novel.txt"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    records, _ = read([path], max_record_bytes=1000)
    assert len(records) > 5 and all(len(r["text"].encode()) <= 1000 for r in records)
    assert "".join(r["text"] for r in records) == path.read_text()
    assert records[1]["id"] == "novel#0001"
