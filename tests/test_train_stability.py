"""Stability guards: the repeated n-gram data gate, spike and non-finite skips, and rollback."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from groundup.config import from_dict
from groundup.tokens.loader import IGNORE_INDEX, Batch
from groundup.model import Transformer
from groundup.train import train
from groundup.train.config import PretrainStabilityConfig, StabilityConfig
from groundup.train.schedules import lr_at
from groundup.train.stability import SpikeGuard, gate_batch, repeated_ngram_fraction
from tests.train_helpers import corpus, make_shards, metrics, shared_shards, tiny_config


def test_repeated_ngram_fraction():
    rng = np.random.default_rng(0)
    natural = rng.integers(0, 5000, size=200)
    looped = np.tile(np.arange(10), 20)  # a 10-token line pasted 20 times
    half = np.concatenate([natural[:100], looped[:100]])
    share = repeated_ngram_fraction(np.stack([natural, looped, half]), 13)
    assert share[0] == 0.0
    assert share[1] == pytest.approx(1 - 10 / 188)  # only the first 10 13-grams are new
    assert 0.3 < share[2] < 0.6


def test_gate_masks_only_repetitive_rows():
    rng = np.random.default_rng(1)
    rows = np.stack([rng.integers(0, 5000, 65), np.tile(np.arange(5), 13), rng.integers(0, 5000, 65)])
    x = torch.from_numpy(rows)
    batch = Batch(x[:, :-1], x[:, 1:].clone(), [[0], [1], [2]], ["text"] * 3)
    gated, dropped = gate_batch(batch, PretrainStabilityConfig())
    assert dropped == [1]
    assert (gated.targets[1] == IGNORE_INDEX).all() and torch.equal(gated.targets[[0, 2]], batch.targets[[0, 2]])
    assert gate_batch(batch, PretrainStabilityConfig(max_repeat_fraction=1.0))[1] == []


def test_spike_guard_uses_the_median_of_accepted_steps():
    guard = SpikeGuard(from_dict(StabilityConfig, {"spike_factor": 4.0, "spike_min_history": 3, "spike_window": 5}))
    assert [guard.judge(s, 2.0, n) for s, n in enumerate([1.0, 1.2, 0.9])] == [None] * 3
    assert "median" in guard.judge(3, 2.0, 10.0)
    assert guard.judge(4, math.nan, 1.0) == "non-finite loss"
    assert guard.judge(5, 2.0, math.inf) == "non-finite gradient"
    assert guard.bad_streak == 3 and guard.streak_start == 3 and guard.should_roll_back() is False
    assert guard.judge(6, 2.0, 1.1) is None and guard.bad_streak == 0
    assert 10.0 not in guard.norms  # a spike never raises the median it is judged against
    again = SpikeGuard(guard.cfg)
    again.load_state_dict(guard.state_dict())
    assert list(again.norms) == list(guard.norms) and again.skipped == 3


def test_data_gate_drops_repeated_documents_and_logs_them(tmp_path):
    spam = {"id": "spam-1", "source": "spam", "domain": "text", "text": "All work and no play. " * 400}
    shards, _ = make_shards(tmp_path, records=corpus(("text",)) + [spam])
    summary = train(tiny_config(shards, "train.max_steps=20", "eval.at_end=false"), tmp_path / "run")
    events = [e for e in metrics(tmp_path / "run")[1] if e["event"] == "data_gate"]
    assert summary["gated_sequences"] == sum(e["sequences"] for e in events) > 0
    assert all(any("spam-1" in names for names in e["documents"]) for e in events)


@pytest.fixture
def poison(monkeypatch):
    """Scale the loss of chosen training forward passes (by call number) by a factor: nan, or 1e4."""
    plan: dict[int, float] = {}
    calls = {"n": 0}
    forward = Transformer.forward

    def poisoned(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if self.training and out.loss is not None:
            factor = plan.get(calls["n"])
            calls["n"] += 1
            if factor is not None:
                out.loss = out.loss * factor
                out.ce_loss = out.ce_loss * factor
        return out

    monkeypatch.setattr(Transformer, "forward", poisoned)
    return plan


def test_spike_is_skipped_with_its_documents(tmp_path_factory, tmp_path, poison):
    poison[7] = 1e4  # step 8's gradient is 10,000x the usual
    shards = shared_shards(tmp_path_factory)[0]
    summary = train(tiny_config(shards, "train.max_steps=10", "stability.spike_min_history=3", "eval.at_end=false"),
                    tmp_path / "run")
    steps, events = metrics(tmp_path / "run")
    (skip,) = [e for e in events if e["event"] == "skip"]
    assert skip["step"] == 8 and "median" in skip["reason"] and skip["documents"]
    assert summary["skipped_steps"] == 1 and summary["steps"] == 10
    assert steps[7]["skipped"] == 1 and all(math.isfinite(s["loss"]) for s in steps if s["step"] != 8)


def test_consecutive_bad_steps_roll_back_with_a_lower_rate(tmp_path_factory, tmp_path, poison):
    for call in (9, 10, 11):  # steps 10-12 (0-based 9-11) have a NaN loss
        poison[call] = math.nan
    shards = shared_shards(tmp_path_factory)[0]
    cfg = tiny_config(shards, "train.max_steps=16", "checkpoint.every=4", "stability.rollback_after=3",
                      "stability.rollback_lr_factor=0.25", "eval.at_end=false", "schedule.warmup_steps=2")
    summary = train(cfg, tmp_path / "run")
    steps, events = metrics(tmp_path / "run")
    skips = [e for e in events if e["event"] == "skip"]
    assert [e["step"] for e in skips] == [10, 11, 12] and all(e["reason"] == "non-finite loss" for e in skips)
    (rollback,) = [e for e in events if e["event"] == "rollback"]
    assert rollback["step"] == 12 and rollback["to_step"] == 8 and rollback["lr_factor"] == 0.25
    after = steps[steps.index(next(s for s in steps if s["step"] == 12)) + 1 :]
    assert [s["step"] for s in after] == list(range(9, 17))  # steps 9.. again, on fresh data
    assert after[0]["lr"] == pytest.approx(0.25 * lr_at(cfg.schedule, 8, 16))
    assert summary["rollbacks"] == 1 and summary["skipped_steps"] == 3 and math.isfinite(summary["train_loss"])
