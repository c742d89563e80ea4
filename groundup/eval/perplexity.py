"""Validation loss and bits per byte, overall and per domain, on held-out token shards.

    from groundup.eval.perplexity import evaluate
    result = evaluate(model, "out/tokens")                 # the whole val split, every domain
    result["bpb"], result["domains"]["code"]["bpb"]

Bits per byte = total cross-entropy (nats) / (ln 2 x UTF-8 bytes of the text predicted). Unlike
loss per token it does not depend on the tokenizer, so models with different vocabularies compare.
The bytes of each target come from the tokenizer's `token_bytes()` (special tokens count 0 bytes;
either backend); over a whole domain they sum to the shard index's byte count (exactly for byte-level
tokenizers; a SentencePiece one also counts the space it prepends), which is used when no tokenizer
is at hand.

Every target of the split is scored exactly once (see `TokenLoader.eval_batches`), in windows of
`seq_len` tokens that restart the context at each window (a standard, slightly pessimistic
estimate). `max_batches` caps each domain for a quick estimate during training. Under data
parallelism each process scores its share and `reduce` sums the totals.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from groundup.tokenizer import load_tokenizer
from groundup.tokens.loader import IGNORE_INDEX, TokenLoader
from groundup.tokens.shards import shards_tokenizer


def _token_bytes(tokenizer, index: dict, shard_dir: Path) -> np.ndarray | None:
    """UTF-8 bytes per token id, from the given tokenizer or the one the shards' index names (if found)."""

    if tokenizer is None:
        found = shards_tokenizer(shard_dir, index)
        return None if found is None else found.token_bytes()
    return tokenizer.token_bytes()


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


@torch.no_grad()
def evaluate(model: torch.nn.Module, shard_dir: str | Path, split: str = "val", domain: str | None = None, *,
             seq_len: int | None = None, batch_size: int = 8, max_batches: int | None = None, tokenizer=None,
             rank: int = 0, world_size: int = 1, reduce: Callable[[list[float]], list[float]] | None = None,
             context: Callable | None = None, bos_aligned: bool = False) -> dict:
    """Loss (nats per token) and bits per byte of `model` on `split` of a shard directory.

    Returns {"loss", "bpb", "tokens", "bytes", "domains": {name: {"loss", "bpb", "tokens", "bytes"}}}.
    `model` may be wrapped (DDP, FSDP2; then every process must call this). `tokenizer`: either backend or
    its directory, checked against the shards' hash; `context()`: what forward runs under (autocast).
    """
    shard_dir = Path(shard_dir)
    inner = _unwrapped(model)
    seq_len = seq_len or inner.cfg.max_seq_len
    device = next(inner.parameters()).device
    if isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(tokenizer)
    loader = TokenLoader(shard_dir, split, seq_len, batch_size, rank=rank, world_size=world_size,
                         bos_aligned=bos_aligned, expected_tokenizer_hash=tokenizer.hash if tokenizer else None)
    token_bytes = _token_bytes(tokenizer, loader.index, shard_dir)
    token_bytes = torch.from_numpy(token_bytes.astype(np.int64)) if token_bytes is not None else None
    domains = [domain] if domain else loader.domains
    was_training = model.training
    model.eval()
    totals: dict[str, list[float]] = {}
    try:
        for name in domains:
            loss_sum = tokens = nbytes = 0.0
            for batch in loader.eval_batches(name, max_batches):
                valid = batch.targets != IGNORE_INDEX
                n = int(valid.sum())
                with context() if context else torch.autocast(device.type, enabled=False):
                    out = model(batch.inputs.to(device), batch.targets.to(device))
                loss_sum += float(out.ce_loss) * n  # ce_loss is the mean over valid targets
                tokens += n
                if token_bytes is not None:
                    nbytes += float(token_bytes[batch.targets[valid]].sum())
            totals[name] = [loss_sum, tokens, nbytes]
    finally:
        model.train(was_training)
    flat = [v for name in domains for v in totals[name]]
    flat = reduce(flat) if reduce else flat
    whole = max_batches is None
    result: dict = {"domains": {}}
    for i, name in enumerate(domains):
        loss_sum, tokens, nbytes = flat[3 * i : 3 * i + 3]
        if token_bytes is None:
            nbytes = float(loader.val_bytes(name)) if whole else 0.0
        result["domains"][name] = _scores(loss_sum, tokens, nbytes)
    sums = [sum(flat[3 * i + k] for i in range(len(domains))) for k in range(3)]
    if token_bytes is None:
        sums[2] = sum(result["domains"][n]["bytes"] for n in domains)
    result.update(_scores(*sums))
    return result


def _scores(loss_sum: float, tokens: float, nbytes: float) -> dict:
    return {"loss": loss_sum / tokens if tokens else float("nan"),
            "bpb": loss_sum / (math.log(2) * nbytes) if nbytes else float("nan"),
            "tokens": int(tokens), "bytes": int(nbytes)}
