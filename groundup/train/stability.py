"""Guards real pretraining runs needed: a data gate, a spike detector, and the rollback trigger.

Data gate. A window of tokens whose repeated n-grams exceed a share (default 15% of 13-grams)
is dropped: its targets are masked, so it adds nothing to the loss or the gradient while the
batch keeps its shape and every process stays in step. A published 12B run added this gate after
a loss spike traced to documents made of repeated token sequences. Repeated share = 1 -
distinct n-grams / n-grams in the window, so natural prose scores near 0 and a line pasted 50
times scores near 1.

Spikes. A step is skipped (no optimizer update) when its loss or gradient is not finite, or when
its pre-clip gradient norm exceeds `spike_factor` x the median of the last `spike_window`
accepted steps' norms. After `rollback_after` consecutive skipped steps the loop rolls back to
the last checkpoint saved before the streak, lowers the learning rate, and continues with the
data after the streak (so the offending batches are not replayed).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import torch

from groundup.tokens.loader import IGNORE_INDEX, Batch
from groundup.train.config import PretrainStabilityConfig, StabilityConfig

_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant: polynomial hashing mod 2**64


def repeated_ngram_fraction(rows: np.ndarray, n: int) -> np.ndarray:
    """For each row of `rows` (B, L), the share of its n-grams that already occurred earlier in it."""
    rows = np.asarray(rows, dtype=np.uint64)
    count = rows.shape[1] - n + 1
    if count < 2:
        return np.zeros(rows.shape[0])
    hashes = np.zeros((rows.shape[0], count), dtype=np.uint64)
    with np.errstate(over="ignore"):  # wrap-around is the point of the hash
        for j in range(n):
            hashes = hashes * _MIX + rows[:, j : j + count] + np.uint64(1)
    ordered = np.sort(hashes, axis=1)
    distinct = 1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)
    return 1.0 - distinct / count


def gate_batch(batch: Batch, cfg: PretrainStabilityConfig) -> tuple[Batch, list[int]]:
    """The batch with over-repetitive rows' targets masked, and those rows' indices."""
    if cfg.max_repeat_fraction >= 1:
        return batch, []
    full = torch.cat([batch.inputs[:, :1], batch.targets], dim=1).numpy()  # the row's seq_len+1 tokens
    valid = (full >= 0).all(axis=1)  # rows padded with IGNORE_INDEX (validation) are not judged
    share = repeated_ngram_fraction(np.where(full < 0, 0, full), cfg.repeat_ngram)
    dropped = [int(i) for i in np.flatnonzero((share > cfg.max_repeat_fraction) & valid)]
    if not dropped:
        return batch, []
    targets = batch.targets.clone()
    targets[dropped] = IGNORE_INDEX
    return batch._replace(targets=targets), dropped


class SpikeGuard:
    """Decides whether a step's update is applied; remembers what exact resume needs."""

    def __init__(self, cfg: StabilityConfig):
        self.cfg = cfg
        self.norms: deque[float] = deque(maxlen=cfg.spike_window)
        self.bad_streak = 0  # consecutive skipped steps
        self.streak_start = -1  # first step of the current streak
        self.skipped = 0
        self.rollbacks = 0
        self.history: list[dict] = []  # one entry per rollback: the step it happened at

    def judge(self, step: int, loss: float, grad_norm: float) -> str | None:
        """None to apply the update, else why the step is skipped. Call once per step."""
        reason = None
        if not math.isfinite(loss):
            reason = "non-finite loss"
        elif not math.isfinite(grad_norm):
            reason = "non-finite gradient"
        elif self.cfg.spike_factor and len(self.norms) >= self.cfg.spike_min_history:
            median = float(np.median(self.norms))
            if grad_norm > self.cfg.spike_factor * median:
                reason = f"gradient norm {grad_norm:.4g} > {self.cfg.spike_factor:g} x median {median:.4g}"
        if reason is None:
            self.norms.append(grad_norm)  # spikes stay out of the median they are judged against
            self.bad_streak = 0
            return None
        if self.bad_streak == 0:
            self.streak_start = step
        self.bad_streak += 1
        self.skipped += 1
        return reason

    def record_broken(self, step: int) -> None:
        """An update left non-finite weights: the step counts as skipped and a rollback must follow."""
        if self.bad_streak == 0:
            self.streak_start = step
        self.bad_streak += 1
        self.skipped += 1

    def should_roll_back(self) -> bool:
        return bool(self.cfg.rollback_after) and self.bad_streak >= self.cfg.rollback_after

    def rolled_back(self, step: int) -> None:
        self.bad_streak = 0
        self.rollbacks += 1
        self.history.append({"step": step})

    def state_dict(self) -> dict:
        return {"norms": list(self.norms), "bad_streak": self.bad_streak, "streak_start": self.streak_start,
                "skipped": self.skipped, "rollbacks": self.rollbacks, "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.norms = deque((float(x) for x in state["norms"]), maxlen=self.cfg.spike_window)
        self.bad_streak = int(state["bad_streak"])
        self.streak_start = int(state["streak_start"])
        self.skipped = int(state["skipped"])
        self.rollbacks = int(state["rollbacks"])
        self.history = [dict(h) for h in state.get("history", [])]
