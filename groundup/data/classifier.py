"""A fastText-style quality classifier: a linear model over hashed word and character n-grams.

Like fastText (and the DCLM / FineWeb-Edu quality filters built on it), a document is the
average of its features: word unigrams and bigrams and character 3- to 5-grams, hashed into
2^bits buckets, so the vocabulary never has to be stored. Training is logistic regression with
Adam on mini-batches; everything is numpy, seeded and needs no download.

The file it writes is an `.npz` without pickled objects (`np.load(..., allow_pickle=False)`):
the weights plus a JSON string with the feature settings and the held-out metrics.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from groundup.data.hashing import MIX, window_hashes, word_hash
from groundup.errors import DataError
from groundup.io import atomic_open

_WORDS = re.compile(r"\w+")
FORMAT = "groundup-quality-classifier-1"


@dataclass
class FeatureSpec:
    bits: int = 20
    char_min: int = 3
    char_max: int = 5
    word_ngrams: int = 2
    max_chars: int = 20_000  # the head of a document says enough about its quality


def features(text: str, spec: FeatureSpec) -> np.ndarray:
    """Bucket ids (with repeats) of a document's hashed n-gram features."""
    text = text[: spec.max_chars].lower()
    words = _WORDS.findall(text)
    parts = []
    if words:
        h = np.fromiter(map(word_hash.__getitem__, words), dtype=np.uint64, count=len(words))
        parts.append(h)
        for n in range(2, spec.word_ngrams + 1):
            if len(h) >= n:
                with np.errstate(over="ignore"):
                    parts.append(window_hashes(h, n) + np.uint64(n))
    data = np.frombuffer(text.encode("utf-8", errors="surrogatepass"), dtype=np.uint8).astype(np.uint64)
    for n in range(spec.char_min, spec.char_max + 1):
        if len(data) >= n:
            g = data[: len(data) - n + 1].copy()
            for k in range(1, n):  # up to 8 bytes fit exactly in 64 bits: no hash needed yet
                g = (g << np.uint64(8)) | data[k: len(data) - n + 1 + k]
            parts.append(g ^ np.uint64(n << 56))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    with np.errstate(over="ignore"):
        mixed = np.concatenate(parts) * MIX  # multiplicative hashing: the top bits are well mixed
    return (mixed >> np.uint64(64 - spec.bits)).astype(np.int64)


def _batch(texts: Sequence[str], spec: FeatureSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR form: (row offsets, bucket ids, weights) with each row's weights summing to 1."""
    rows = [features(t, spec) for t in texts]
    sizes = np.array([len(r) for r in rows], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    ids = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    weights = np.repeat(1.0 / np.maximum(sizes, 1), sizes)
    return offsets, ids, weights


def _logits(w: np.ndarray, bias: float, offsets: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return np.bincount(rows, weights=w[ids] * weights, minlength=len(offsets) - 1) + bias


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve as the Mann-Whitney statistic (ties count one half)."""
    pos, neg = labels == 1, labels == 0
    if not pos.any() or not neg.any():
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(avg, counts)
    n_pos, n_neg = pos.sum(), neg.sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class QualityClassifier:
    def __init__(self, weights: np.ndarray, bias: float, spec: FeatureSpec, metrics: dict | None = None):
        self.weights, self.bias, self.spec, self.metrics = weights, bias, spec, metrics or {}

    def score(self, texts: Sequence[str]) -> np.ndarray:
        """Probability that each text belongs to the positive (high-quality) class."""
        z = _logits(self.weights, self.bias, *_batch(texts, self.spec))
        return 1.0 / (1.0 + np.exp(-z))

    def save(self, path: str | Path) -> None:
        meta = {"format": FORMAT, "spec": asdict(self.spec), "bias": self.bias, "metrics": self.metrics}
        with atomic_open(path, "wb") as f:
            np.savez_compressed(f, weights=self.weights.astype(np.float32),
                                meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: str | Path) -> "QualityClassifier":
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(data["meta"].tobytes().decode())
                weights = data["weights"].astype(np.float64)
        except (OSError, KeyError, ValueError) as e:
            raise DataError(f"{path}: not a quality classifier written by 'groundup data train-classifier' ({e})") from None
        if meta.get("format") != FORMAT:
            raise DataError(f"{path}: unknown classifier format {meta.get('format')!r}")
        return cls(weights, float(meta["bias"]), FeatureSpec(**meta["spec"]), meta.get("metrics"))


def train(positive: Sequence[str], negative: Sequence[str], spec: FeatureSpec | None = None, epochs: int = 8,
          lr: float = 0.05, l2: float = 1e-6, batch_size: int = 256, holdout: float = 0.1,
          seed: int = 0) -> QualityClassifier:
    """Train on texts labelled 1 (positive) and 0 (negative); report held-out accuracy and AUC.

    Classes are weighted to balance, so a 10:1 imbalance does not teach "always say positive".
    """
    spec = spec or FeatureSpec()
    if not positive or not negative:
        raise DataError(f"need positive and negative examples: got {len(positive)} and {len(negative)}")
    texts = list(positive) + list(negative)
    labels = np.concatenate([np.ones(len(positive)), np.zeros(len(negative))])
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    n_test = max(1, int(len(texts) * holdout)) if len(texts) >= 10 else 0
    test, train_idx = order[:n_test], order[n_test:]
    class_weight = np.where(labels == 1, len(labels) / (2 * labels.sum()), len(labels) / (2 * (1 - labels).sum()))
    offsets, ids, weights = _batch([texts[i] for i in train_idx], spec)
    y, cw = labels[train_idx], class_weight[train_idx]
    size = 1 << spec.bits
    w, bias = np.zeros(size), 0.0
    m, v, mb, vb, step = np.zeros(size), np.zeros(size), 0.0, 0.0, 0
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    for _ in range(epochs):
        perm = rng.permutation(len(train_idx))  # a new order each epoch, as SGD wants
        for start in range(0, len(perm), batch_size):
            rows = perm[start:start + batch_size]
            sizes = np.diff(offsets)[rows]
            sub_offsets = np.concatenate(([0], np.cumsum(sizes)))
            take = np.repeat(offsets[rows] - sub_offsets[:-1], sizes) + np.arange(sub_offsets[-1])
            sub_ids, sub_weights = ids[take], weights[take]
            z = _logits(w, bias, sub_offsets, sub_ids, sub_weights)
            err = (1.0 / (1.0 + np.exp(-z)) - y[rows]) * cw[rows] / len(rows)
            grad = np.bincount(sub_ids, weights=np.repeat(err, sizes) * sub_weights, minlength=size) + l2 * w
            gb = float(err.sum())
            step += 1
            m = beta1 * m + (1 - beta1) * grad
            v = beta2 * v + (1 - beta2) * grad * grad
            mb, vb = beta1 * mb + (1 - beta1) * gb, beta2 * vb + (1 - beta2) * gb * gb
            correction = np.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
            w -= lr * correction * m / (np.sqrt(v) + eps)
            bias -= lr * correction * mb / (np.sqrt(vb) + eps)
    model = QualityClassifier(w, bias, spec)
    metrics = {"train_docs": int(len(train_idx)), "heldout_docs": int(n_test),
               "positive": len(positive), "negative": len(negative)}
    if n_test:
        scores = model.score([texts[i] for i in test])
        metrics["heldout_accuracy"] = float(((scores >= 0.5) == (labels[test] == 1)).mean())
        metrics["heldout_auc"] = auc(labels[test], scores)
    model.metrics = metrics
    return model
