"""train.time_limit_s: the plan from measured steps, re-plans within the schedule's rules, the stop."""

from __future__ import annotations

import pytest

from groundup.config import load_config
from groundup.io import read_json
from groundup.train import TrainConfig, train
from groundup.train import time_budget as tb
from groundup.train.config import ScheduleConfig
from groundup.train.schedules import Schedule, lr_at
from tests.train_helpers import metrics, shared_shards, tiny_config


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def budget_with(monkeypatch, step_s: float, eval_s: float, checkpoint_s: float, now: float = 10.0):
    clock = Clock(now)
    monkeypatch.setattr(tb.time, "time", clock)
    budget = tb.TimeBudget(100.0, began=0.0, start_step=0)
    for step in range(1, 12):
        budget.step_done(step, 50.0 if step <= tb.WARMUP_STEPS else step_s)  # slow warm-up steps are left out
    budget.timed("eval", eval_s)
    budget.timed("checkpoint", checkpoint_s)
    return budget, clock


def config(max_steps=1000, eval_every=100, checkpoint_every=250):
    return load_config(TrainConfig, None, [f"train.max_steps={max_steps}", f"eval.every={eval_every}",
                                           f"checkpoint.every={checkpoint_every}", "train.time_limit_s=100"])


def projected_end(budget, cfg, step, now):
    """Seconds at which a run of cfg, at `step` now, ends at the budget's measured costs."""
    left = cfg.train.max_steps - step
    return (now + left * budget.step_time() + left // cfg.eval.every * budget.eval_s
            + left // cfg.checkpoint.every * budget.checkpoint_s + budget.eval_s + budget.checkpoint_s)


def test_the_plan_ends_the_run_at_the_deadline_and_keeps_the_number_of_evaluations(monkeypatch):
    budget, clock = budget_with(monkeypatch, step_s=0.05, eval_s=1.0, checkpoint_s=0.5)
    assert budget.step_time() == 0.05  # the warm-up steps' 50 s are not in it
    cfg = config()
    steps, eval_every, ckpt_every = budget.plan(cfg, step=11)
    planned = tb.apply_plan(cfg, steps, eval_every, ckpt_every)
    end = projected_end(budget, planned, 11, clock.now)
    # 90 s left: about 1,500 steps once 11 evaluations and 5 checkpoints are paid for; the 2% margin
    # for the loop's own work ends it a little early, never late.
    assert 100 * 0.96 < end <= 100.0
    assert 1300 < steps < 1700
    assert round(steps / eval_every) == 10 and round(steps / ckpt_every) == 4
    assert not budget.drifted(planned, 11) or budget.plans == 0  # drift is judged only after a plan
    budget.plans = 1
    assert not budget.drifted(planned, 11)
    clock.now += 20  # a competing process: 20 s lost
    assert budget.drifted(planned, 11)


def test_should_stop_leaves_room_for_the_last_evaluation_and_checkpoint(monkeypatch):
    budget, clock = budget_with(monkeypatch, step_s=1.0, eval_s=3.0, checkpoint_s=2.0)
    clock.now = 100 - 3 - 2 - 2 * 1.0 - 0.01  # this step and one more still fit
    assert not budget.should_stop(eval_at_end=True)
    clock.now += 0.02
    assert budget.should_stop(eval_at_end=True)
    assert not budget.should_stop(eval_at_end=False)  # no final evaluation: 3 s more
    assert not tb.TimeBudget(0.0, 0.0, 0).should_stop(True)  # no limit


def test_a_limit_spent_during_the_warm_up_stops_on_the_warm_up_steps(monkeypatch):
    clock = Clock(0.0)
    monkeypatch.setattr(tb.time, "time", clock)
    budget = tb.TimeBudget(10.0, began=0.0, start_step=0)
    assert not budget.should_stop(eval_at_end=False)  # nothing measured: the first step always runs
    clock.now = 4.0
    budget.step_done(1, 4.0)  # a warm-up step: not a steady step time, but all there is
    assert not budget.steps and budget.should_stop(eval_at_end=False)  # 4 + 2 x 4 > 10
    budget = tb.TimeBudget(100.0, began=0.0, start_step=0)
    budget.step_done(1, 4.0)
    assert not budget.should_stop(eval_at_end=False)  # plenty of time: the warm-up goes on


@pytest.mark.parametrize("kind,step,new,allowed", [
    ("wsd", 70, 90, True),     # before the decay of either length (decay starts at 80 and 72)
    ("wsd", 75, 90, False),    # inside the decay of the shorter length
    ("wsd", 79, 120, True),    # the last stable step of the current length
    ("wsd", 80, 120, False),   # the current length's decay has begun
    ("cosine", 40, 100, True),
    ("cosine", 40, 70, False),  # past half of the new length
    ("constant", 99, 10_000, True),
])
def test_when_the_schedule_allows_a_new_length(kind, step, new, allowed):
    cfg = ScheduleConfig(kind=kind, peak_lr=1.0, min_lr=0.1, warmup_steps=0, decay_fraction=0.2)
    assert Schedule(cfg, 100).may_change_length(step, new) is allowed
    if kind == "wsd" and allowed:  # the point of the rule: the rate is the same under both lengths
        assert lr_at(cfg, step, 100) == lr_at(cfg, step, new) == 1.0


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return shared_shards(tmp_path_factory)[0]


def test_a_time_limited_run_plans_from_its_steps_ends_on_time_and_resumes_with_the_plan(shards, tmp_path):
    limit = 8.0
    cfg = tiny_config(shards, "train.max_steps=1000000", f"train.time_limit_s={limit}", "eval.every=200000",
                      "checkpoint.every=500000", "schedule.kind=wsd", "log.every=10",
                      "train.threads=1")  # two threads beside a busy process can be 30x slower
    summary = train(cfg, tmp_path / "run")
    assert read_json(tmp_path / "run" / "summary.json") == summary
    assert 0.85 * limit <= summary["wall_time_s"] <= 1.05 * limit
    steps, events = metrics(tmp_path / "run")
    plans = [e for e in events if e["event"] == "replan"]
    assert plans and plans[0]["reason"] == "measured" and plans[0]["previous_max_steps"] == 1000000
    assert plans[0]["step"] == 2 + tb.FIRST_PLAN_AFTER  # two warm-up steps, then five timed ones
    saved = load_config(TrainConfig, tmp_path / "run" / "config.toml")
    assert saved.train.max_steps == summary["max_steps"] == plans[-1]["max_steps"]
    assert saved.eval.every == plans[-1]["eval_every"]  # the cadence follows max_steps: at most the 5 asked for,
    first = plans[0]  # fewer when they would take over a fifth of the time left
    evals = first["max_steps"] / first["eval_every"]
    assert evals <= 5.5 and (evals >= 4.5 or evals * first["eval_s"] <= 0.21 * first["seconds_left"])
    # The plan's last step, or the stop when a slower stretch after the schedule's last re-plan left
    # too little time: either way with a checkpoint and an evaluation there.
    assert summary["steps"] == saved.train.max_steps or summary["time_limit_reached"]
    assert (tmp_path / "run" / "checkpoints" / f"step_{summary['steps']:07d}").is_dir()
    assert summary["val_bpb"] is not None
    if summary["time_limit_reached"]:
        assert events[-1]["event"] == "time_limit"
        resumed = train(load_config(TrainConfig, tmp_path / "run" / "config.toml", ["train.time_limit_s=0"]),
                        tmp_path / "run", resume=True)
        assert resumed["steps"] == saved.train.max_steps  # the plan is the run's length from now on
    assert summary["replans"] >= 1


def test_time_limit_must_be_finite_and_not_negative():
    with pytest.raises(Exception, match="time_limit_s"):
        load_config(TrainConfig, None, ["train.time_limit_s=-1"])
