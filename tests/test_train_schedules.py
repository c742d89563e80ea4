"""Learning-rate schedules, and the rate being set before each optimizer step, once per step."""

from __future__ import annotations

import math

import pytest

from groundup.config import from_dict
from groundup.train import train
from groundup.train.config import ScheduleConfig
from groundup.train.schedules import lr_at, warmup_steps
from tests.train_helpers import metrics, shared_shards, tiny_config


def schedule(**kw) -> ScheduleConfig:
    return from_dict(ScheduleConfig, kw)


def test_defaults_are_the_published_12b_recipe():
    cfg = ScheduleConfig()
    assert (cfg.kind, cfg.warmup_steps, cfg.peak_lr, cfg.min_lr) == ("cosine", 2000, 3e-4, 3e-5)
    assert warmup_steps(cfg, 100_000) == 2000
    assert warmup_steps(cfg, 200) == 20  # a short run still reaches its peak


def test_cosine_warms_up_linearly_then_decays_to_the_floor():
    cfg = schedule(warmup_steps=10, peak_lr=1e-3, min_lr=1e-4)
    lrs = [lr_at(cfg, s, 110) for s in range(110)]
    assert lrs[:10] == pytest.approx([1e-3 * (s + 1) / 10 for s in range(10)])
    assert lrs[9] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[60] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 50 / 99)))


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_wsd_holds_the_peak_then_decays_in_the_last_fraction(shape):
    cfg = schedule(kind="wsd", warmup_steps=5, peak_lr=1e-3, min_lr=0.0, decay_fraction=0.2, decay_shape=shape)
    lrs = [lr_at(cfg, s, 100) for s in range(100)]
    assert lrs[5:80] == [1e-3] * 75
    assert all(a > b for a, b in zip(lrs[79:], lrs[80:]))
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    middle = lrs[89]  # halfway through the decay: the shapes differ
    expected = {"linear": 0.5, "cosine": 0.5, "sqrt": 1 - math.sqrt(0.5)}[shape]
    assert middle == pytest.approx(1e-3 * expected, rel=1e-6)


def test_constant_after_warmup():
    cfg = schedule(kind="constant", warmup_steps=4, peak_lr=2e-4)
    assert [lr_at(cfg, s, 50) for s in range(6)] == pytest.approx([5e-5, 1e-4, 1.5e-4, 2e-4, 2e-4, 2e-4])


def test_rate_is_set_before_each_optimizer_step_and_once_per_step(tmp_path_factory, tmp_path, monkeypatch):
    """What each optimizer.step() sees is the rate for that step, with 3 micro-batches per step."""
    import groundup.train.state as state_module  # where the training state builds its optimizers

    seen: list[float] = []
    build = state_module.build_optimizers

    def spying_build(model, cfg):
        optimizers = build(model, cfg)
        optimizers[0].register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
        return optimizers

    monkeypatch.setattr(state_module, "build_optimizers", spying_build)
    shards = shared_shards(tmp_path_factory)[0]
    cfg = tiny_config(shards, "train.max_steps=12", "train.grad_accum=3", "train.batch_size=2",
                      "schedule.warmup_steps=4", "schedule.peak_lr=1e-3", "schedule.min_lr=1e-4",
                      "eval.at_end=false", "stability.spike_factor=0")
    train(cfg, tmp_path / "run")
    expected = [lr_at(cfg.schedule, s, 12) for s in range(12)]
    assert seen == pytest.approx(expected, rel=1e-12)  # step s used lr(s): not lr(s-1), not per micro-batch
    assert [m["lr"] for m in metrics(tmp_path / "run")[0]] == pytest.approx(expected, rel=1e-12)
