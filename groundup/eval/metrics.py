"""Metrics and standard errors exactly as lm-evaluation-harness computes them, and the CORE centring.

    choice_metrics(lls, choices, gold)     # {"acc", "acc_norm", "acc_bytes"} for one item
    mean_stderr([1, 0, 1, 1])              # sample std (n - 1) / sqrt(n): lm-eval's stderr of a mean
    perplexity(lls)                        # exp(-mean(ll)): lm-eval's `perplexity` aggregation
    bootstrap_stderr(perplexity_of, lls)   # lm-eval's bootstrap, draw for draw (100,000 resamples)
    centered(acc, random_baseline)         # (acc - b) / (1 - b): nanochat's CORE centring

Multiple choice (`api/task.py` process_results): pred = argmax of the summed log-likelihoods;
acc_norm divides each by the number of characters of the choice (`doc_to_choice`, without the
target delimiter), acc_bytes by its UTF-8 bytes; numpy's argmax takes the first of equal values.

lm-eval bootstraps the perplexity's standard error: `iters // 1000` chunks, chunk i drawing 1,000
resamples with `random.Random(i).choices(xs, k=len(xs))`, and reports the sample standard deviation
(n - 1) of the replicates. `bootstrap_stderr` draws the very same indices with numpy's MT19937
seeded as Python seeds it (`RandomState([i])` = `Random(i)`: same state, same 53-bit doubles,
index = floor(u * n)), vectorised, so the number matches lm-eval's to rounding.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np


def choice_metrics(lls: Sequence[float], choices: Sequence[str], gold: int) -> dict[str, float]:
    """An item's accuracies; log-likelihoods that are not all finite pick no winner (every metric 0: numpy's
    argmax would take the first NaN, or the first of equal -infs, and score a broken model right)."""
    lls = np.asarray(lls, dtype=np.float64)
    if not np.isfinite(lls).all():
        return {"acc": 0.0, "acc_norm": 0.0, "acc_bytes": 0.0}
    chars = np.array([float(len(c)) for c in choices])
    nbytes = np.array([float(len(c.encode("utf-8"))) for c in choices])
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"acc": float(np.argmax(lls) == gold), "acc_norm": float(np.argmax(lls / chars) == gold),
                "acc_bytes": float(np.argmax(lls / nbytes) == gold)}


def sample_stddev(xs: Sequence[float]) -> float:
    xs = np.asarray(xs, dtype=np.float64)
    if len(xs) < 2:
        return float("nan")
    return float(math.sqrt(((xs - xs.mean()) ** 2).sum() / (len(xs) - 1)))


def mean_stderr(xs: Sequence[float]) -> float:
    """lm-eval's `mean_stderr`; NaN for fewer than two values (lm-eval would divide by zero)."""
    return sample_stddev(xs) / math.sqrt(len(xs)) if len(xs) >= 2 else float("nan")


def perplexity(lls: Sequence[float]) -> float:
    return float(math.exp(-float(np.mean(lls)))) if len(lls) else float("nan")


def perplexity_of(resamples: np.ndarray) -> np.ndarray:
    """`perplexity` of each row of a (draws, n) array of log-likelihoods."""
    return np.exp(-resamples.mean(axis=1))


def bootstrap_stderr(statistic: Callable[[np.ndarray], np.ndarray], xs: Sequence[float],
                     iters: int = 100_000) -> float:
    """lm-eval's `bootstrap_stderr(f, xs, iters)` with `statistic` applied to rows of resamples."""
    xs = np.asarray(xs, dtype=np.float64)
    n = len(xs)
    chunk = min(1000, iters)
    if n == 0 or iters <= 0 or iters // chunk < 1:
        return float("nan")
    step = max(1, (1 << 24) // max(n, 1))  # draws per array: about 128 MB of indices at a time
    values = []
    for i in range(iters // chunk):
        rng = np.random.RandomState([i])
        left = chunk
        while left:
            take = min(step, left)
            idx = (rng.random_sample((take, n)) * n).astype(np.int64)
            values.append(statistic(xs[idx]))
            left -= take
    return sample_stddev(np.concatenate(values))


def centered(value: float, random_baseline: float) -> float:
    """nanochat's CORE centring: 0 at chance, 1 at perfect."""
    return (value - random_baseline) / (1.0 - random_baseline)


def core_metric(metrics: Sequence[str]) -> str:
    """The accuracy a multiple-choice task contributes to the centred aggregate: acc_norm where lm-eval
    reports it (the length-normalised accuracy), else acc."""
    return "acc_norm" if "acc_norm" in metrics else "acc"


def summarize(values: Sequence[float]) -> dict:
    """{mean, std, p10, p50, p90, n} of a list of numbers (NaN-free)."""
    xs = np.asarray([v for v in values if v == v], dtype=np.float64)
    if not len(xs):
        return {"n": 0}
    q = np.quantile(xs, [0.1, 0.5, 0.9])
    return {"n": int(len(xs)), "mean": float(xs.mean()), "std": float(xs.std()), "p10": float(q[0]),
            "p50": float(q[1]), "p90": float(q[2])}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass_at_k: k = {k} exceeds the number of samples n = {n}")
    if k < 1 or c < 0 or c > n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))
