"""TokenLoader: windows are real data, exact resume, disjoint ranks, domain weights, BOS packing,
validation that covers every token once, and clear refusals."""

from __future__ import annotations

import collections
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tokenizer_helpers import small_corpus, tok, write_jsonl  # noqa: E402, F401  (tok: a fixture)

from groundup.tokens.loader import IGNORE_INDEX, TokenLoader  # noqa: E402
from groundup.tokens.shards import TokenizeConfig, open_split, tokenize_to_shards  # noqa: E402
from groundup.errors import DataError  # noqa: E402

T, B = 32, 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tok) -> Path:
    d = tmp_path_factory.mktemp("loader")
    data = write_jsonl(d / "in.jsonl", small_corpus())
    tokenize_to_shards([data], tok, d / "shards", TokenizeConfig(val_fraction=0.1, shard_tokens=60_000),
                       progress=False)
    return d / "shards"


def domain_stream(shards: Path, split: str, domain: str) -> np.ndarray:
    return np.concatenate([f.tokens for f in open_split(shards, split) if f.domain == domain]).astype(np.int64)


def contains(stream: np.ndarray, row: np.ndarray) -> bool:
    """Whether `row` occurs in `stream` read as a ring."""
    ring = np.concatenate([stream, stream[: len(row)]])
    for i in np.flatnonzero(ring[: len(stream)] == row[0]):
        if np.array_equal(ring[i : i + len(row)], row):
            return True
    return False


def roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_batches_are_shifted_windows_of_real_data(shards, tok):
    loader = TokenLoader(shards, "train", T, B, seed=3, expected_tokenizer_hash=tok.hash)
    streams = {d: domain_stream(shards, "train", d) for d in loader.domains}
    for _ in range(5):
        batch = next(loader)
        assert batch.inputs.shape == batch.targets.shape == (B, T) and batch.inputs.dtype == torch.int64
        assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
        for i in range(B):
            row = torch.cat([batch.inputs[i], batch.targets[i, -1:]]).numpy()
            assert contains(streams[batch.domains[i]], row)
            names = loader.document_names(batch.docs[i])
            assert names and all(isinstance(n, str) and not n.startswith("#") for n in names)


def test_resume_is_exact_across_epochs(shards):
    for bos in (False, True):
        kwargs = dict(seed=7, domain_weights={"text": 1, "code": 1, "math": 2}, bos_aligned=bos)
        a = TokenLoader(shards, "train", T, B, **kwargs)
        for _ in range(300):  # the math domain (~25K tokens) wraps into later epochs
            next(a)
        state = roundtrip(a.state_dict())
        expected = [next(a) for _ in range(40)]
        b = TokenLoader(shards, "train", T, B, **kwargs)
        b.load_state_dict(state)
        for x, y in zip(expected, (next(b) for _ in range(40))):
            assert torch.equal(x.inputs, y.inputs) and torch.equal(x.targets, y.targets)
            assert x.docs == y.docs and x.domains == y.domains
        assert a.epochs == b.epochs and (bos or a.epochs["math"] >= 1)


def test_ranks_read_disjoint_windows(shards):
    loaders = [TokenLoader(shards, "val", T, 2, rank=r, world_size=2, seed=1) for r in range(2)]
    windows_per_rank = min(len(ld._order(d, 0)) for ld in loaders for d in ld.domains)
    rows = []
    for ld in loaders:
        seen = set()
        while min(ld._cursor[d][1] for d in ld.domains) < windows_per_rank // 2:
            batch = next(ld)
            seen.update((dom, tuple(batch.inputs[i].tolist())) for i, dom in enumerate(batch.domains))
        rows.append(seen)
    assert rows[0] and rows[1] and not rows[0] & rows[1]


def test_domain_weights_are_applied_when_sampling(shards):
    loader = TokenLoader(shards, "train", T, 50, seed=0, domain_weights={"text": 3, "code": 1})
    counts = collections.Counter(d for _ in range(40) for d in next(loader).domains)
    assert set(counts) == {"text", "code"}
    assert 0.70 < counts["text"] / sum(counts.values()) < 0.80
    natural = TokenLoader(shards, "train", T, 50, seed=0)
    tokens = natural.index["splits"]["train"]["domains"]
    total = natural.index["splits"]["train"]["tokens"]
    assert natural.weights["math"] == pytest.approx(tokens["math"]["tokens"] / total)


def test_bos_aligned_rows_start_documents(shards, tok):
    loader = TokenLoader(shards, "train", T, B, seed=2, bos_aligned=True)
    files = open_split(shards, "train")
    first_tokens = {}
    for f in files:
        for k in range(f.documents):
            first_tokens[f.first_doc + k] = np.asarray(f.tokens[f.starts[k] : min(f.starts[k + 1], f.starts[k] + T)])
    for _ in range(10):
        batch = next(loader)
        for i in range(B):
            row = torch.cat([batch.inputs[i], batch.targets[i, -1:]]).numpy()
            assert row[0] == tok.bos_id
            doc = first_tokens[batch.docs[i][0]]
            n = min(len(doc), T)
            assert np.array_equal(row[1 : 1 + n], doc[:n])  # the row starts at that document's start
            eots = np.flatnonzero(row[:-1] == tok.eot_id)
            assert all(row[e + 1] == tok.bos_id for e in eots)  # every following document has its BOS


@pytest.mark.parametrize("bos", [False, True])
def test_validation_covers_every_token_once(shards, tok, bos):
    token_bytes = torch.from_numpy(tok.token_bytes()).long()
    single = TokenLoader(shards, "val", T, 3, bos_aligned=bos)
    for domain in single.domains:
        stream = domain_stream(shards, "val", domain)
        targets = torch.cat([b.targets.flatten() for b in single.eval_batches(domain)])
        targets = targets[targets != IGNORE_INDEX]
        if not bos:
            assert torch.equal(targets, torch.from_numpy(stream))
        else:
            assert torch.equal(targets[targets != tok.bos_id], torch.from_numpy(stream))
        assert int(token_bytes[targets].sum()) == single.val_bytes(domain)
    again = [b.targets for b in single.eval_batches()]
    assert all(torch.equal(x, y.targets) for x, y in zip(again, single.eval_batches()))  # deterministic
    ranks = [list(TokenLoader(shards, "val", T, 3, rank=r, world_size=2, bos_aligned=bos).eval_batches())
             for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])  # every rank runs the same number of steps
    total = sum(int((b.targets != IGNORE_INDEX).sum()) for r in ranks for b in r)
    assert total == sum(int((b.targets != IGNORE_INDEX).sum()) for b in single.eval_batches())


def test_refusals_are_clear(shards, tok, tmp_path):
    with pytest.raises(DataError, match=f"made by tokenizer {tok.hash}, but this run uses tokenizer ffff"):
        TokenLoader(shards, "train", T, B, expected_tokenizer_hash="ffff")
    with pytest.raises(DataError, match="domain_weights names \\['poetry'\\]"):
        TokenLoader(shards, "train", T, B, domain_weights={"poetry": 1.0})
    with pytest.raises(DataError, match="not all 0"):
        TokenLoader(shards, "train", T, B, domain_weights={"text": 0.0})
    with pytest.raises(DataError, match="fewer than world_size 100000"):
        TokenLoader(shards, "train", 4096, B, rank=0, world_size=100_000)
    tiny_val = TokenLoader(shards, "val", 4096, B, rank=63, world_size=64)  # fine for evaluation
    assert len(list(tiny_val.eval_batches())) == 1
    with pytest.raises(DataError, match="no split 'test'"):
        TokenLoader(shards, "test", T, B)
    state = TokenLoader(shards, "train", T, B).state_dict()
    with pytest.raises(DataError, match="seq_len: saved 32, now 64"):
        TokenLoader(shards, "train", 64, B).load_state_dict(state)
    with pytest.raises(DataError, match="no index"):
        TokenLoader(tmp_path, "train", T, B)
    with pytest.raises(DataError, match="no domain 'poetry'"):
        next(TokenLoader(shards, "val", T, B).eval_batches("poetry"))
