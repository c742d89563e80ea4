"""Bits per byte of a model on token shards or on raw text files, per domain.

    bits_per_byte(model, tok, "out/tokens")              # a `data tokenize` directory: its val split
    bits_per_byte(model, tok, "heldout.jsonl")            # JSONL / Parquet / text records, any reader input

Token shards go to `eval/perplexity.evaluate` (the split's every target once, windows restarting the
context; the shards' tokenizer must be the model's). Raw records are read by `data.iter_records`
and tokenised with the model's tokenizer: per domain, one stream `prefix, doc, eot, [prefix,] doc,
eot, ...` (the prefix, e.g. a bos token, is repeated only when it is not the end-of-text separator,
so groundup's streams read exactly like its token shards), cut into windows of the model's context
+ 1 that overlap by one token, so every token after the first is scored exactly once, with the
context restarting at each window. A window's start-of-document prefix tokens are not scored;
end-of-text tokens are (as in the shards). Log-probabilities come from `model/logprobs.logprobs`.
Bits per byte = summed negative log-likelihood / ln 2 / UTF-8 bytes of the scored tokens (the
tokenizer's `token_bytes`; special tokens count 0 bytes), overall and per domain.

`document_bits_per_byte` scores each text on its own, as `bits_per_byte` scores a file holding only
that text; `CheckpointBitsPerByte` is that for a checkpoint path, loaded on first use (the perplexity
filter of `data curate`, data/web/perplexity.py, takes it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Hashable, Iterable, Iterator, Sequence

import numpy as np
import torch

from groundup.data import ReadStats, iter_records
from groundup.eval.perplexity import evaluate
from groundup.eval.scoring import prefix_ids
from groundup.loading import load_for_inference
from groundup.model.logprobs import logprobs
from groundup.model.loss import IGNORE_INDEX


def is_token_shards(path: str | Path) -> bool:
    return (Path(path) / "index.json").is_file()


def bits_per_byte(model, tokenizer, path: str | Path, *, split: str = "val", batch_size: int = 8,
                  seq_len: int | None = None, progress: Callable[[int], None] | None = None) -> dict:
    """{"kind", "loss", "bpb", "tokens", "bytes", "domains": {name: {...}}} for one path."""
    if is_token_shards(path):
        result = evaluate(model, path, split, tokenizer=tokenizer, batch_size=batch_size, seq_len=seq_len)
        return {"kind": f"token shards ({split} split)", **result}
    return {"kind": "text records", **_text_bpb(model, tokenizer, path, batch_size, seq_len, progress)}


def _windows(tokenizer, path, seq_len: int, read_stats) -> Iterator[tuple[str, list[int], list[bool]]]:
    """(domain, window ids, scored flags) over every domain's stream, in order of arrival."""
    texts = ((record.get("domain") or "text", record["text"]) for record in iter_records([path], read_stats))
    return _stream_windows(tokenizer, texts, seq_len)


def _stream_windows(tokenizer, keyed_texts: Iterable[tuple[Hashable, str]],
                    seq_len: int) -> Iterator[tuple[Hashable, list[int], list[bool]]]:
    """(key, window ids, scored flags) over one stream per key (a domain, or one document), in order."""

    prefix = prefix_ids(tokenizer)
    eot = tokenizer.eot_id
    repeat_prefix = prefix != [eot]
    buffers: dict[Hashable, tuple[list[int], list[bool]]] = {}
    for domain, text in keyed_texts:
        ids, flags = buffers.setdefault(domain, ([], []))
        head = prefix if (not ids and not flags) or repeat_prefix else []
        body = tokenizer.encode(text) + ([eot] if eot is not None else [])
        ids += head + body
        flags += [False] * len(head) + [True] * len(body)
        while len(ids) > seq_len + 1:
            yield domain, ids[: seq_len + 1], flags[: seq_len + 1]
            del ids[:seq_len], flags[:seq_len]
    for domain, (ids, flags) in buffers.items():
        if len(ids) > 1:
            yield domain, ids, flags


@torch.no_grad()
def _score(model, batch: list[tuple[str, list[int], list[bool]]], token_bytes: np.ndarray, totals: dict) -> None:
    device = model.device
    T = max(len(ids) for _, ids, _ in batch) - 1
    inputs = torch.zeros((len(batch), T), dtype=torch.long)  # padding: its targets are ignored
    targets = torch.full((len(batch), T), IGNORE_INDEX, dtype=torch.long)
    for r, (_, ids, flags) in enumerate(batch):
        n = len(ids) - 1
        inputs[r, :n] = torch.tensor(ids[:-1])
        targets[r, :n] = torch.tensor([t if f else IGNORE_INDEX for t, f in zip(ids[1:], flags[1:])])
    lp = logprobs(model, inputs.to(device), targets.to(device)).cpu()
    for r, (domain, _, _) in enumerate(batch):
        valid = targets[r] != IGNORE_INDEX
        t = totals.setdefault(domain, [0.0, 0, 0])
        t[0] -= float(lp[r][valid].sum())
        t[1] += int(valid.sum())
        t[2] += int(token_bytes[targets[r][valid].numpy()].sum())


def _scores(nll: float, tokens: int, nbytes: int) -> dict:
    return {"loss": nll / tokens if tokens else float("nan"),
            "bpb": nll / (math.log(2) * nbytes) if nbytes else float("nan"), "tokens": tokens, "bytes": nbytes}


def _text_bpb(model, tokenizer, path, batch_size: int, seq_len: int | None, progress) -> dict:
    seq_len = min(seq_len or model.cfg.max_seq_len, model.cfg.max_seq_len)
    token_bytes = np.asarray(tokenizer.token_bytes(), dtype=np.int64)
    totals: dict[str, list] = {}
    stats = ReadStats()
    batch = []
    was_training = model.training
    model.eval()
    try:
        for window in _windows(tokenizer, path, seq_len, stats):
            batch.append(window)
            if len(batch) == batch_size:
                _score(model, batch, token_bytes, totals)
                if progress is not None:
                    progress(len(batch))
                batch = []
        if batch:
            _score(model, batch, token_bytes, totals)
            if progress is not None:
                progress(len(batch))
    finally:
        model.train(was_training)
    domains = {name: _scores(*totals[name]) for name in sorted(totals)}
    nll, tokens, nbytes = (sum(t[k] for t in totals.values()) for k in range(3))
    problems = {k: v for k, v in stats.to_dict().items() if v and k not in ("files", "records", "bytes")
                and not k.endswith("_examples")}
    return {**_scores(nll, tokens, nbytes), "domains": domains, "records": stats.records,
            "skipped": problems}


@torch.no_grad()
def document_bits_per_byte(model, tokenizer, texts: Sequence[str], *, batch_size: int = 8,
                           seq_len: int | None = None) -> list[float]:
    """Each text's bits per byte alone (its own stream `prefix, text, eot`, the windows and scoring above):
    what `bits_per_byte` reports for a file holding only that text; nan for a text of no bytes."""
    seq_len = min(seq_len or model.cfg.max_seq_len, model.cfg.max_seq_len)
    token_bytes = np.asarray(tokenizer.token_bytes(), dtype=np.int64)
    totals: dict[int, list] = {}
    batch = []
    was_training = model.training
    model.eval()
    try:
        for window in _stream_windows(tokenizer, enumerate(texts), seq_len):
            batch.append(window)
            if len(batch) == batch_size:
                _score(model, batch, token_bytes, totals)
                batch = []
        if batch:
            _score(model, batch, token_bytes, totals)
    finally:
        model.train(was_training)
    return [_scores(*totals[i])["bpb"] if i in totals else float("nan") for i in range(len(texts))]


class CheckpointBitsPerByte:
    """texts -> bits per byte each under the checkpoint at `path` (a model or run directory), loaded on the
    first call, once per process; it pickles without the model, so spawned workers load their own."""

    def __init__(self, path: str | Path, device: str = "cpu", batch_size: int = 8):
        self.path, self.device, self.batch_size = str(path), device, batch_size
        self._loaded = None

    def __call__(self, texts: Sequence[str]) -> list[float]:
        if self._loaded is None:
            self._loaded = load_for_inference(self.path, self.device)
        model, tokenizer = self._loaded
        return document_bits_per_byte(model, tokenizer, texts, batch_size=self.batch_size)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_loaded": None}
