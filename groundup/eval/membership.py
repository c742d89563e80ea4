"""Membership scores: did the model see this text in training? Min-K% Prob and Min-K%++, per item.

    min_k_prob([-0.1, -3.0, -0.2, -5.0, -0.3], k=0.2)          # -5.0: the mean of the lowest 20% of log p
    min_k_plus_plus(lp, mu, sigma, k=0.2)                     # the same over (log p - mu) / sigma
    scores = score_texts(model, tok, texts)                   # [{"min_k", "min_k_pp", "tokens"}, ...]
    membership(model, tok, {"arc_easy": texts}, reference="shuffled")

Min-K% Prob (Shi et al. 2023): the mean log-probability of the k% least likely tokens of a text
(k = 20%; at least one token). Min-K%++ (Zhang et al. 2024) first standardises each token's log p by
the model's own distribution at that position, z = (log p(x_t) - mu_t) / sigma_t with mu_t =
E_{z~p}[log p(z)] and sigma_t its standard deviation (model/logprobs.token_stats' logp_mean and
logp_std), then averages the k% lowest. Higher scores mean "more likely seen". Neither is a verdict
on one item: what carries information is the distribution over a benchmark compared with text the
model cannot have seen, here each item's words shuffled (`reference="shuffled"`, same words and
lengths) or freshly generated math problems from groundup.corpus (`reference="math"`, a new seed).
`auc` is the probability that a benchmark item scores above a reference text (0.5: no signal).

Texts are scored after the tokenizer's prefix, cut to the model's context.
"""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np
import torch

from groundup.corpus import generate_math_records
from groundup.errors import ConfigError
from groundup.eval.metrics import summarize
from groundup.eval.scoring import prefix_ids
from groundup.model.logprobs import token_stats
from groundup.model.loss import IGNORE_INDEX

K = 0.2


def _lowest_mean(values: np.ndarray, k: float) -> float:
    if not len(values):
        return float("nan")
    n = max(1, int(len(values) * k))
    return float(np.sort(values)[:n].mean())


def min_k_prob(logprobs: Sequence[float], k: float = K) -> float:
    return _lowest_mean(np.asarray(logprobs, dtype=np.float64), k)


def min_k_plus_plus(logprobs: Sequence[float], mu: Sequence[float], sigma: Sequence[float], k: float = K) -> float:
    lp, mu, sigma = (np.asarray(x, dtype=np.float64) for x in (logprobs, mu, sigma))
    return _lowest_mean((lp - mu) / np.maximum(sigma, 1e-12), k)


@torch.no_grad()
def score_texts(model, tokenizer, texts: Sequence[str], k: float = K, batch_size: int = 8) -> list[dict]:
    device = model.device
    context = model.cfg.max_seq_len
    prefix = prefix_ids(tokenizer)
    rows = [(prefix + ids)[: context + 1] for ids in tokenizer.encode_batch(list(texts))]
    out = []
    for s in range(0, len(rows), batch_size):
        batch = rows[s: s + batch_size]
        T = max(2, max(len(r) for r in batch)) - 1
        inputs = torch.zeros((len(batch), T), dtype=torch.long)
        targets = torch.full((len(batch), T), IGNORE_INDEX, dtype=torch.long)
        for r, ids in enumerate(batch):
            if len(ids) > 1:
                inputs[r, : len(ids) - 1] = torch.tensor(ids[:-1])
                targets[r, : len(ids) - 1] = torch.tensor(ids[1:])
        st = token_stats(model, inputs.to(device), targets.to(device))
        valid = (targets != IGNORE_INDEX).numpy()
        lp, mu, sd = (x.float().cpu().numpy() for x in (st.logprobs, st.logp_mean, st.logp_std))
        for r in range(len(batch)):
            v = valid[r]
            out.append({"min_k": min_k_prob(lp[r][v], k), "min_k_pp": min_k_plus_plus(lp[r][v], mu[r][v], sd[r][v], k),
                        "tokens": int(v.sum())})
    return out


def shuffled(texts: Sequence[str], seed: int = 0) -> list[str]:
    """Each text's words in a seeded random order: the same words, text no corpus holds."""
    rnd = random.Random(seed)
    out = []
    for t in texts:
        words = t.split()
        rnd.shuffle(words)
        out.append(" ".join(words))
    return out


def fresh_math(n: int, seed: int | None = None) -> list[str]:
    seed = random.SystemRandom().randrange(1 << 30) if seed is None else seed
    return [r["text"] for r in generate_math_records(n, seed=seed)]


def auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(a positive scores above a negative), ties counting one half (Mann-Whitney U / n m)."""
    pos, neg = np.asarray(positive, dtype=np.float64), np.asarray(negative, dtype=np.float64)
    pos, neg = pos[~np.isnan(pos)], neg[~np.isnan(neg)]
    if not len(pos) or not len(neg):
        return float("nan")
    both = np.concatenate([pos, neg])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(len(both))
    sorted_vals = both[order]
    i = 0
    while i < len(both):  # average ranks over ties
        j = i
        while j + 1 < len(both) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i: j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def membership(model, tokenizer, task_texts: dict[str, list[str]], *, reference: str = "shuffled", k: float = K,
               batch_size: int = 8, seed: int = 0) -> dict:
    """Per task: Min-K% and Min-K%++ summaries on its items and on the reference text, and their AUC."""
    if reference not in ("shuffled", "math"):
        raise ConfigError(f"reference = {reference!r}: expected 'shuffled' or 'math'", key="reference")
    out = {"k": k, "reference": reference, "tasks": {}}
    for name, texts in task_texts.items():
        ref_texts = shuffled(texts, seed) if reference == "shuffled" else fresh_math(len(texts))
        mine = score_texts(model, tokenizer, texts, k, batch_size)
        ref = score_texts(model, tokenizer, ref_texts, k, batch_size)
        entry = {}
        for key, label in (("min_k", "min_k_prob"), ("min_k_pp", "min_k_plus_plus")):
            a, b = [s[key] for s in mine], [s[key] for s in ref]
            entry[label] = {"task": summarize(a), "reference": summarize(b), "auc": auc(a, b)}
        entry["items"] = [{"min_k_prob": s["min_k"], "min_k_plus_plus": s["min_k_pp"], "tokens": s["tokens"]}
                          for s in mine]
        out["tasks"][name] = entry
    return out
