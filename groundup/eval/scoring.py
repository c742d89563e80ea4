"""Log-likelihoods of (context, continuation) requests, tokenised as lm-evaluation-harness does, each
shared context computed once.

    enc = encode_requests(tokenizer, [(context, " choice"), ...], max_len=model.cfg.max_seq_len)
    scores = score_requests(model, enc, batch_size=32, groups=[[0, 1, 2, 3], ...])   # [Score(logprob, greedy, tokens)]

Tokenisation is HFLM's (`lm_eval/api/model.py` `_encode_pair`, `loglikelihood`): trailing spaces of
the context move to the continuation; whole = prefix + encode(context + continuation), context =
prefix + encode(context), continuation = whole[len(context):]; an empty context is the prefix token
alone. `prefix` is the tokenizer's `prefix_ids` (groundup's `<|end_of_text|>`, or what a Hugging Face
post-processor puts first: lm-eval's HFLM with its default add_bos_token, which leaves the
tokenizer's post-processor alone, sees the same). A request longer than the
model's context keeps its last max_len + 1 tokens (lm-eval's left truncation: the start of the
context is lost) and says how many it dropped.

Scoring: requests are scored in groups that share a prefix (an item's choices; by default requests
with identical contexts). A group's longest common token prefix is prefilled once into a KV cache (a
batch of groups together, left-padded); the cache is copied to one row per request, and each row's
remaining tokens run against it, scored with the TokenLogprobs or TokenStatistics head (model/heads.py:
chunked; only continuation tokens are targets, and the context part of a prefix never reaches the
output layer). Choices sharing a context cost the context once; Winogrande's two contexts share all
but the option; continuations that start alike (PIQA) share those tokens' log-probabilities too.
A request's log-likelihood is the float64 sum over its continuation tokens and `greedy` says whether
each was the arg-max (lm-eval's is_greedy). The numbers are those of one plain forward pass over
context + continuation (tests check them against a full log-softmax), up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from groundup.model.heads import Logits, TokenLogprobs, TokenStatistics
from groundup.model.kv_cache import KVCache
from groundup.model.loss import IGNORE_INDEX


@dataclass
class Encoded:
    """One request in token ids, ready to score; `error` set when it cannot be scored."""

    context: list[int]
    continuation: list[int]
    truncated: int = 0  # tokens dropped from the start of the context
    error: str | None = None


@dataclass
class Score:
    logprob: float  # sum of log p over the continuation tokens
    greedy: bool | None  # every continuation token was the most likely one (None: not asked for)
    tokens: int  # continuation tokens


def prefix_ids(tokenizer) -> list[int]:
    """What goes before a plain document: the tokenizer's `prefix_ids` (end-of-text for groundup's)."""
    found = getattr(tokenizer, "prefix_ids", None)
    if found is not None:
        return list(found)
    return [tokenizer.eot_id] if tokenizer.eot_id is not None else []


def encode_pair(tokenizer, context: str, continuation: str, prefix: Sequence[int]) -> tuple[list[int], list[int]]:
    """lm-eval's (context_enc, continuation_enc) for one request."""
    prefix = list(prefix)
    if context == "":
        cont = tokenizer.encode(continuation)
        first = prefix[0] if prefix else tokenizer.eot_id
        if cont and cont[0] == first:
            return cont[:1], cont[1:]
        return [first], cont
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = prefix + tokenizer.encode(context + continuation)
    ctx = prefix + tokenizer.encode(context)
    return ctx, whole[len(ctx):]


def encode_requests(tokenizer, requests: Sequence[tuple[str, str]], max_len: int,
                    prefix: Sequence[int] | None = None) -> list[Encoded]:
    """Every request encoded and fitted to `max_len` (the model's context), in order."""
    prefix = prefix_ids(tokenizer) if prefix is None else list(prefix)
    out = []
    for context, continuation in requests:
        ctx, cont = encode_pair(tokenizer, context, continuation, prefix)
        if not cont:
            out.append(Encoded(ctx, cont, error=f"continuation {continuation!r} encodes to no tokens"))
        elif not ctx:
            out.append(Encoded(ctx, cont, error="empty context and a tokenizer without a prefix token"))
        elif len(cont) > max_len:
            out.append(Encoded(ctx, cont, error=f"continuation of {len(cont)} tokens exceeds the model's "
                                                 f"context of {max_len}"))
        else:
            total = len(ctx) + len(cont)
            cut = max(0, total - (max_len + 1))  # lm-eval: (ctx + cont)[-(max_len + 1):][:-1]
            out.append(Encoded(ctx[cut:], cont, truncated=cut))
    return out


def _common_prefix(encoded: Sequence[Encoded], members: Sequence[int]) -> tuple[int, int]:
    """(prefix, shared): how many leading tokens the members' prefilled prefix holds, and how many of
    the continuation tokens it predicts are scored once for all members.

    The members share their first n tokens. The prediction of the first token where they differ
    belongs to each member, so when that token is scored the prefix stops one short of n. Members
    whose contexts have one length may share the start of their continuations too (PIQA's two
    solutions often begin alike): the log-probabilities of those tokens are the same for every member
    and come from the prefix. Members with contexts of different lengths share no scored token."""
    seqs = [encoded[i].context + encoded[i].continuation for i in members]
    contexts = {len(encoded[i].context) for i in members}
    c = min(contexts)
    limit = min(len(s) for s in seqs) - 1  # every member keeps at least one token of its own
    n = 0
    while n < limit and all(s[n] == seqs[0][n] for s in seqs):
        n += 1
    if n <= c - 1:  # the first token that differs is context: nobody scores its prediction
        return n, 0
    if len(contexts) > 1:
        return c - 1, 0
    return n - 1, n - c


def _row_length(encoded: Sequence[Encoded], prefix: int, i: int) -> int:
    return len(encoded[i].context) + len(encoded[i].continuation) - 1 - prefix


def _scores(model, tokens: torch.Tensor, targets: torch.Tensor, cache: KVCache, greedy: bool):
    """(float64 sum of log p per row, every scored token greedy per row or None): the shared scorer."""
    device = model.device
    tokens, targets = tokens.to(device), targets.to(device)
    if not greedy:  # log-probabilities alone: the cheaper of the two chunked scorers
        lp = model(tokens, targets, TokenLogprobs(), cache=cache)
        return lp.double().sum(dim=1).cpu(), None  # float64: -1,500 is only representable to 1.2e-4 in float32
    stats = model(tokens, targets, TokenStatistics(), cache=cache)
    flags = (stats.greedy | (targets == IGNORE_INDEX)).all(dim=1)
    return stats.logprobs.double().sum(dim=1).cpu(), flags.cpu()


def _passes(lengths: Sequence[int], budget: int, max_rows: int, pass_cost: int, extra: int = 0,
            max_tokens: int | None = None) -> list[tuple[int, int]]:
    """Split rows sorted longest first into passes [start, end), each padded to its first row's length.

    A pass costs about `pass_cost` token positions more than its padded rows (reading every weight
    once), so the split minimises sum(pass_cost + rows x first length) by dynamic programming under
    the limits: at most `max_rows` rows and `budget` padded positions a pass (and rows x (length +
    extra) <= max_tokens, the attention cache). Grouping long rows with short ones wastes padding;
    too many small passes waste weight reads."""
    n = len(lengths)
    best = [0.0] + [float("inf")] * n
    start_of = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(end - 1, max(-1, end - 1 - max_rows), -1):
            rows, width = end - start, max(1, lengths[start])
            if rows > 1 and (rows * width > budget
                             or (max_tokens is not None and rows * (width + extra) > max_tokens)):
                break  # more rows only add to the first row's width
            cost = best[start] + pass_cost + rows * width
            if cost < best[end]:
                best[end], start_of[end] = cost, start
    out, end = [], n
    while end:
        out.append((start_of[end], end))
        end = start_of[end]
    return out[::-1]


def _pass_cost(model) -> int:
    """Token positions one extra forward pass is worth: on a CPU a pass reads every weight once,
    about what 50 more positions cost (measured for a 4M-parameter model at batch 1 against 32);
    accelerators are far more starved by small passes."""
    return 48 if model.device.type == "cpu" else 512


def _prefill(model, encoded: Sequence[Encoded], groups: list[tuple[int, int, list[int]]], batch_size: int,
             pad_id: int, greedy: bool):
    """Each group's shared prefix in the KV cache, right-aligned in buffers of the longest prefix
    (group g's real positions are the last `prefix_g`), and the log-likelihood (and greedy flag) of
    the continuation tokens it holds. Groups come sorted by prefix length, longest first; each
    forward pass holds about `batch_size` prefixes of the mean length (fewer long ones, more short
    ones), padded only to its own longest. Only the columns holding shared continuation tokens go
    through the output layer."""
    cfg = model.cfg
    device, dtype = model.device, model.dtype
    P = groups[0][0]
    store = KVCache(cfg, len(groups), P, device, dtype)
    shared_lp = torch.zeros(len(groups), dtype=torch.float64)
    shared_greedy = torch.ones(len(groups), dtype=torch.bool)
    budget = batch_size * max(1, sum(g[0] for g in groups) // len(groups))
    prefixes = [g[0] for g in groups if g[0]]
    for s, end in _passes(prefixes, budget, 4 * batch_size, _pass_cost(model)):
        width = groups[s][0]
        part = groups[s: end]
        scored = max(shared for _, shared, _ in part)  # the last `scored` columns are scored
        pads = torch.tensor([width - prefix for prefix, _, _ in part], device=device)
        ids = torch.full((len(part), width), pad_id, dtype=torch.long)
        targets = torch.full((len(part), scored), IGNORE_INDEX, dtype=torch.long)
        for k, (prefix, shared, members) in enumerate(part):
            seq = encoded[members[0]].context + encoded[members[0]].continuation
            ids[k, width - prefix:] = torch.tensor(seq[:prefix])
            if shared:
                targets[k, scored - shared:] = torch.tensor(seq[prefix - shared + 1: prefix + 1])
        cache = KVCache(cfg, len(part), width, device, dtype, pads if bool(pads.any()) else None)
        if width > scored:
            model(ids[:, : width - scored].to(device), head=Logits(last_only=True), cache=cache)
        if scored:
            lp, flags = _scores(model, ids[:, width - scored:], targets, cache, greedy)
            shared_lp[s: s + len(part)] = lp
            if flags is not None:
                shared_greedy[s: s + len(part)] = flags
        for mine, theirs in zip(store.layers, cache.layers):  # RoPE positions count from each row's first
            for a, b in ((mine.a, theirs.a), (mine.b, theirs.b)):  # real token: shifting right is exact
                a.narrow(0, s, len(part)).narrow(mine.seq_dim, P - width, width).copy_(b)
    return [(layer.a, layer.b) for layer in store.layers], shared_lp, shared_greedy


@torch.no_grad()
def _score_rows(model, encoded: Sequence[Encoded], groups, rows: list[tuple[int, int]], prefilled, pad_id: int,
                greedy: bool) -> list[tuple[int, Score]]:
    """Score `rows` ((group index, request)) against the prefilled prefixes."""
    cfg = model.cfg
    device, dtype = model.device, model.dtype
    P = groups[0][0] if prefilled is not None else 0
    C = max(_row_length(encoded, groups[g][0], i) for g, i in rows)
    index = torch.tensor([g for g, _ in rows])
    pads = torch.tensor([P - groups[g][0] for g, _ in rows], device=device)
    cache = KVCache(cfg, len(rows), P + C, device, dtype, pads if bool(pads.any()) else None)
    if P:
        store, shared_lp, shared_greedy = prefilled
        for layer, (a, b) in zip(cache.layers, store):  # each row gets a copy of its group's prefix
            layer.a.narrow(layer.seq_dim, 0, P).copy_(a.index_select(0, index.to(a.device)))
            layer.b.narrow(layer.seq_dim, 0, P).copy_(b.index_select(0, index.to(b.device)))
        cache.advance(P)
    tokens = torch.full((len(rows), C), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), C), IGNORE_INDEX, dtype=torch.long)
    for r, (g, i) in enumerate(rows):
        seq, prefix, first = encoded[i].context + encoded[i].continuation, groups[g][0], len(encoded[i].context)
        start = max(0, first - 1 - prefix)  # the continuation only is scored
        tokens[r, : len(seq) - 1 - prefix] = torch.tensor(seq[prefix:-1])
        targets[r, start: len(seq) - 1 - prefix] = torch.tensor(seq[prefix + 1 + start:])
    logprob, flags = _scores(model, tokens, targets, cache, greedy)
    if P:
        logprob = logprob + shared_lp[index]
        flags = flags & shared_greedy[index] if flags is not None else None
    return [(i, Score(float(logprob[r]), None if flags is None else bool(flags[r]), len(encoded[i].continuation)))
            for r, (_, i) in enumerate(rows)]


@torch.no_grad()
def _score_span(model, encoded, groups, batch_size: int, max_tokens: int, pad_id: int, greedy: bool,
                progress) -> list:
    """Prefill the groups' prefixes, then score all their rows sorted by length, longest first, each
    pass holding about `batch_size` rows of the span's mean length (fewer long rows, more short
    ones: little padding)."""
    prefilled = _prefill(model, encoded, groups, batch_size, pad_id, greedy) if groups[0][0] else None
    P = groups[0][0] if prefilled is not None else 0
    rows = sorted(((g, i) for g, (_, _, members) in enumerate(groups) for i in members),
                  key=lambda r: -_row_length(encoded, groups[r[0]][0], r[1]))
    lengths = [_row_length(encoded, groups[g][0], i) for g, i in rows]
    budget = batch_size * max(1, sum(lengths) // len(lengths))
    out = []
    for s, end in _passes(lengths, budget, 4 * batch_size, _pass_cost(model), extra=P, max_tokens=max_tokens):
        out += _score_rows(model, encoded, groups, rows[s: end], prefilled, pad_id, greedy)
        if progress is not None:
            progress(end - s)
    return out


def score_requests(model, encoded: Sequence[Encoded], batch_size: int = 32, max_tokens: int = 1 << 16,
                   pad_id: int = 0, groups: Sequence[Sequence[int]] | None = None,
                   progress: Callable[[int], None] | None = None, span_rows: int | None = None,
                   greedy: bool = True) -> list[Score | None]:
    """A Score per request in order (None where `error` is set).

    `groups`: requests that share a prefix (an item's choices); default: requests with identical
    contexts. Each group's longest common token prefix is computed once (see `_common_prefix`: with
    equal contexts it may reach into the continuations, whose shared tokens are then scored once).
    Groups are taken longest prefix first in spans of about `span_rows` requests (default
    8 x batch_size): a span's prefixes are prefilled, `batch_size` groups per pass, then its
    requests run sorted by length, about `batch_size` rows of the span's mean length per pass (up to
    4x more of shorter ones), at most `max_tokens` rows x length (memory). `greedy=False` skips the
    arg-max flags (Score.greedy is None), scoring with the cheaper TokenLogprobs head.
    `progress(n)` is called with the number of requests each pass finished."""
    if batch_size < 1:
        raise ValueError(f"batch_size = {batch_size}: expected at least 1")
    span_rows = span_rows or 8 * batch_size
    if groups is None:
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, e in enumerate(encoded):
            by_context.setdefault(tuple(e.context), []).append(i)
        groups = list(by_context.values())
    chunks = []
    for members in groups:  # a group larger than a span is split
        members = [i for i in members if encoded[i].error is None]
        for s in range(0, len(members), span_rows):  # (nothing when every member failed)
            part = members[s: s + span_rows]
            chunks.append((*_common_prefix(encoded, part), part))
    chunks.sort(key=lambda g: -g[0])  # similar prefixes prefill together
    out: list[Score | None] = [None] * len(encoded)
    was_training = model.training
    model.eval()
    try:
        s = 0
        while s < len(chunks):  # a span's rows sit after its longest prefix: all must fit the context
            span, rows = [], 0
            while s < len(chunks) and (not span or (
                    rows + len(chunks[s][2]) <= span_rows
                    and span[0][0] + max(_row_length(encoded, chunks[s][0], i) for i in chunks[s][2])
                    <= model.cfg.max_seq_len)):
                span.append(chunks[s])
                rows += len(chunks[s][2])
                s += 1
            for i, score in _score_span(model, encoded, span, batch_size, max_tokens, pad_id, greedy, progress):
                out[i] = score
    finally:
        model.train(was_training)
    return out
