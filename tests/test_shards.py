"""Token shards: format and index, exact round trip of every document, split rules, bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tokenizer_helpers import small_corpus, tok, trained_tokenizer_dir, write_jsonl  # noqa: E402, F401  (tok: fixture)

from groundup.cli import main  # noqa: E402
from groundup.tokens.shards import (  # noqa: E402
    INDEX_FILE,
    TokenizeConfig,
    check_tokenizer,
    document_score,
    open_split,
    read_index,
    tokenize_to_shards,
)
from groundup.errors import DataError  # noqa: E402
from groundup.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[dict]]:
    records = small_corpus()
    d = tmp_path_factory.mktemp("corpus")
    write_jsonl(d / "prose.jsonl", [r for r in records if r["domain"] == "text"])
    write_jsonl(d / "rest.jsonl", [r for r in records if r["domain"] != "text"])
    return d, records


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tok, corpus) -> Path:
    out = tmp_path_factory.mktemp("shards")
    tokenize_to_shards([corpus[0]], tok, out, TokenizeConfig(val_fraction=0.1, shard_tokens=100_000), progress=False)
    return out


def read_documents(out: Path, split: str) -> dict[str, np.ndarray]:
    """Record id -> token array (with its end-of-text), read back through the index."""
    docs = {}
    for f in open_split(out, split):
        ids = [json.loads(line) for line in f.ids_path.read_text().splitlines()]
        assert len(ids) == f.documents
        for k, rid in enumerate(ids):
            docs[rid] = np.asarray(f.tokens[f.starts[k]:f.starts[k + 1]])
    return docs


def test_every_document_round_trips_through_the_shards(shards, tok, corpus):
    records = {r["id"]: r for r in corpus[1]}
    seen = {}
    for split in ("train", "val"):
        for rid, tokens in read_documents(shards, split).items():
            assert tokens[-1] == tok.eot_id and tok.eot_id not in tokens[:-1]
            assert tok.decode(tokens[:-1]) == records[rid]["text"]
            assert tokens[:-1].tolist() == tok.encode(records[rid]["text"])
            seen[rid] = split
    assert set(seen) == set(records)
    for rid, split in seen.items():  # the split rule, document by document
        assert split == ("val" if document_score(records[rid]["text"], 0) < 0.1 else "train")


def test_index_counts_add_up(shards, tok, corpus):
    index = read_index(shards)
    assert index["dtype"] == "uint16" and index["tokenizer_hash"] == tok.hash
    assert (index["eot_id"], index["bos_id"], index["vocab_size"]) == (tok.eot_id, tok.bos_id, tok.vocab_size)
    records = corpus[1]
    assert index["documents"] == len(records)
    assert index["bytes"] == sum(len(r["text"].encode()) for r in records)
    for split in ("train", "val"):
        info = index["splits"][split]
        for key in ("tokens", "documents", "bytes"):
            assert info[key] == sum(d[key] for d in info["domains"].values())
            assert info[key] == sum(s[key] for s in info["sources"].values())
            assert info[key] == sum(s[key] for s in info["shards"])
        for entry in info["shards"]:
            assert (shards / entry["file"]).stat().st_size == 2 * entry["tokens"]
            starts = np.load(shards / entry["offsets"])
            assert starts[0] == 0 and starts[-1] == entry["tokens"] and len(starts) == entry["documents"] + 1
            assert entry["file"].startswith(f"{split}/{entry['domain']}-")
    assert len(index["splits"]["train"]["shards"]) > 3  # shard_tokens=100,000 rolled over to new files
    assert index["tokens"] == sum(index["splits"][s]["tokens"] for s in ("train", "val"))
    assert set(index["splits"]["val"]["domains"]) == {"text", "code", "math"}


def test_output_is_independent_of_workers_and_shard_size(shards, tok, corpus, tmp_path):
    tokenize_to_shards([corpus[0]], tok, tmp_path, TokenizeConfig(val_fraction=0.1, workers=1), progress=False)
    for split in ("train", "val"):
        a, b = read_documents(shards, split), read_documents(tmp_path, split)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_each_split_gets_at_least_one_document(tok, tmp_path):
    data = write_jsonl(tmp_path / "two.jsonl", [{"id": "a", "source": "s", "domain": "text", "text": "first one"},
                                                {"id": "b", "source": "s", "domain": "text", "text": "second"}])
    for fraction in (0.0, 0.99):
        index = tokenize_to_shards([data], tok, tmp_path / f"o{fraction}", TokenizeConfig(val_fraction=fraction),
                                   progress=False)
        assert index["splits"]["train"]["documents"] == 1 and index["splits"]["val"]["documents"] == 1
    one = write_jsonl(tmp_path / "one.jsonl", [{"id": "a", "source": "s", "domain": "text", "text": "alone"}])
    with pytest.raises(DataError, match="one.jsonl: 1 non-empty document"):
        tokenize_to_shards([one], tok, tmp_path / "x", progress=False)


def test_identical_documents_share_a_split(tok, tmp_path):
    rows = [{"id": str(i), "source": "s", "domain": "text", "text": f"document {i % 20}"} for i in range(200)]
    out = tmp_path / "o"
    tokenize_to_shards([write_jsonl(tmp_path / "d.jsonl", rows)], tok, out, TokenizeConfig(val_fraction=0.3),
                       progress=False)
    where = {}
    for split in ("train", "val"):
        for rid in read_documents(out, split):
            where.setdefault(int(rid) % 20, set()).add(split)
    assert all(len(s) == 1 for s in where.values()) and {"train", "val"} == set().union(*where.values())


def test_large_vocabulary_uses_uint32(tmp_path):
    # 256 bytes + 65,400 two-byte tokens: past uint16, without training a huge tokenizer.
    pairs = [bytes([a, b]) for a in range(256) for b in range(256)][:65_400]
    tok = Tokenizer([bytes([b]) for b in range(256)] + pairs, r"\S+|\s+")
    rows = [{"id": str(i), "source": "s", "domain": "text", "text": "\u00ff\u00fe xyz " * (i + 1)} for i in range(5)]
    out = tmp_path / "o"
    index = tokenize_to_shards([write_jsonl(tmp_path / "d.jsonl", rows)], tok, out, progress=False)
    assert index["dtype"] == "uint32"
    tokens = np.concatenate([f.tokens for s in ("train", "val") for f in open_split(out, s)])
    assert tokens.dtype == np.dtype("<u4") and tokens.max() == tok.eot_id > 65_535


def test_bad_input_gives_clear_errors(tok, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="no records found in .*empty.jsonl"):
        tokenize_to_shards([empty], tok, tmp_path / "o", progress=False)
    no_text = tmp_path / "no_text.jsonl"
    no_text.write_text('{"content": "x"}\n{"text": 5}\n')
    with pytest.raises(DataError, match=r"no_text.jsonl:1: no string 'text' field"):
        tokenize_to_shards([no_text], tok, tmp_path / "o", progress=False)
    with pytest.raises(DataError, match="input not found"):
        tokenize_to_shards([tmp_path / "missing.jsonl"], tok, tmp_path / "o", progress=False)
    # Invalid UTF-8 is replaced, counted in the index, and tokenized.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b'{"text": "caf\xe9 ok"}\n{"text": "fine text"}\n{"text": "more text"}\n')
    index = tokenize_to_shards([mixed], tok, tmp_path / "m", progress=False)
    assert index["read"]["invalid_utf8"] == 1 and index["documents"] == 3


def test_a_crash_never_leaves_a_complete_looking_output(tok, corpus, tmp_path, monkeypatch):
    out = tmp_path / "o"
    tokenize_to_shards([corpus[0]], tok, out, TokenizeConfig(shard_tokens=50_000), progress=False)
    assert (out / INDEX_FILE).is_file()
    with pytest.raises(DataError, match="input not found"):  # failing before any write keeps the output
        tokenize_to_shards([tmp_path / "typo.jsonl"], tok, out, progress=False)
    assert read_index(out)["tokens"] > 0
    import groundup.tokens.writer as writer

    def failing(tok, batches, fn, workers=0):
        for i, batch in enumerate(batches):
            if i == 2:
                raise RuntimeError("disk on fire")
            yield fn(tok, batch)

    monkeypatch.setattr(writer, "map_batches", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        tokenize_to_shards([corpus[0]], tok, out, TokenizeConfig(shard_tokens=50_000, batch_bytes=100_000),
                           progress=False)
    assert not (out / INDEX_FILE).exists()  # the previous index no longer vouches for anything
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]  # no half-written file is left
    with pytest.raises(DataError, match="no index"):
        open_split(out, "train")


def test_tokenizer_hash_is_checked(shards, tok):
    index = read_index(shards)
    check_tokenizer(index, tok.hash, shards)
    with pytest.raises(DataError, match=f"tokenizer {tok.hash}, but this run uses tokenizer 0123456789abcdef"):
        check_tokenizer(index, "0123456789abcdef", shards)


def test_cli(tmp_path_factory, corpus, tmp_path, capsys):
    tokdir = trained_tokenizer_dir(tmp_path_factory)
    out = tmp_path / "o"
    assert main(["data", "tokenize", "--tokenizer", str(tokdir), "--input", str(corpus[0]), "--out", str(out),
                 "--val-fraction", "0.05", "--quiet", "shard_tokens=200000"]) == 0
    printed = capsys.readouterr().out
    assert "tokens (uint16)" in printed and "val:" in printed
    assert read_index(out)["val_fraction"] == 0.05
    assert main(["data", "tokenize", "--tokenizer", str(tmp_path), "--input", str(corpus[0]), "--out",
                 str(out)]) == 2
    assert "tokenizer not found" in capsys.readouterr().err
    assert main(["data", "tokenize", "--tokenizer", str(tokdir), "--input", str(corpus[0]), "--out", str(out),
                 "val_fraction=1.5"]) == 2
    assert "val_fraction = 1.5: expected a number in [0, 1)" in capsys.readouterr().err


def test_split_group_keeps_every_chunk_and_edition_of_a_work_together(tmp_path):
    from groundup.tokens.shards import TokenizeConfig as Config

    records = [{"id": f"shakespeare/{w}{ed}#{c:04d}", "text": f"{w} {ed} chunk {c} " * 20, "domain": "text",
                "work": w}
               for w in ("hamlet", "lear", "macbeth", "othello", "tempest", "romeo") for ed in ("_gut", "_gut_f")
               for c in range(3)]
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    from infer_helpers import small_tokenizer

    index = tokenize_to_shards([src], small_tokenizer(), tmp_path / "out",
                               Config(workers=1, val_fraction=0.3, split_group="work"),
                               progress=False)
    val, train = set(index["groups"]["val"]), set(index["groups"]["train"])
    assert val and train and not val & train and val | train == {"hamlet", "lear", "macbeth", "othello", "tempest",
                                                                 "romeo"}
    assert index["splits"]["val"]["documents"] == 6 * len(val)  # 2 editions x 3 chunks of each held-out work
