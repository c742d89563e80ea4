"""train.time_limit_s: fit a run to a wall-clock budget from what its steps actually take.

A time-limited run treats `train.max_steps` as a first guess. After a few steady steps (the first
two of a session allocate and warm kernels up, so they are left out) it times one evaluation and
one checkpoint, then sets max_steps so that the remaining steps, the evaluations and checkpoints
still due and the final ones end at the limit: this is the plan. The eval and checkpoint cadences
scale with max_steps, so the run keeps the number of evaluations and checkpoints it was given,
unless they would take more than OVERHEAD_SHARE of the time left: then there are fewer.

The plan is checked CHECKS times over the run and re-made, from the step times of the recent
window, when the projected end drifts by more than `DRIFT` of the budget (a competing process
started or finished): while the schedule allows a new length without a jump in the rate
(`Schedule.may_change_length`: WSD before its decay, cosine in its first half). Whatever happens
afterwards, the run stops once the next step would not leave time for the final evaluation and
checkpoint, and saves both: the limit is never overrun by more than one step.

Each plan is a metrics.jsonl event {"event": "replan", ...} and rewrites RUN/config.toml, so a
resumed run continues with the plan's max_steps.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import deque

WARMUP_STEPS = 2  # steps of a session left out of the step time (allocation, kernel warm-up)
FIRST_PLAN_AFTER = 5  # steady steps timed before the first plan
WINDOW = 30  # recent steps the step time is taken over (the median: robust to a stray slow step)
MARGIN = 1.02  # steps planned at 2% over the measured time: the loop's own work between steps
DRIFT = 0.03  # re-plan when the projected end moves by more than this share of the budget
OVERHEAD_SHARE = 0.2  # at most this share of the time left goes to periodic evaluations and checkpoints
MIN_STEPS_BETWEEN_PLANS = 10  # new step times a re-plan needs (fewer: noise, not a change)
CHECKS = 40  # times per run the projection is checked (a broadcast from the main process each)


class TimeBudget:
    def __init__(self, limit_s: float, began: float, start_step: int):
        self.limit = limit_s
        self.deadline = began + limit_s
        self.start_step = start_step
        self.steps: deque[float] = deque(maxlen=WINDOW)
        self.last_step_s: float | None = None  # any step's, warm-up included
        self.eval_s: float | None = None  # the last evaluation's seconds
        self.checkpoint_s: float | None = None
        self.saves: list[dict] = []  # {"step", "blocked_s"} of each checkpoint this session (see loop._save)
        self.plans = 0
        self.steps_since_plan = 0

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    # --------------------------------------------------------------- measurements

    def step_done(self, step: int, seconds: float) -> None:
        self.last_step_s = seconds
        if step > self.start_step + WARMUP_STEPS:
            self.steps.append(seconds)
            self.steps_since_plan += 1

    def timed(self, kind: str, seconds: float) -> None:
        setattr(self, f"{kind}_s", seconds)

    def step_time(self) -> float:
        return statistics.median(self.steps)

    # --------------------------------------------------------------- decisions

    def wants_first_plan(self) -> bool:
        return self.enabled and self.plans == 0 and len(self.steps) >= FIRST_PLAN_AFTER

    def final_cost(self, eval_at_end: bool) -> float:
        """Seconds the end of the run takes after its last step: an evaluation and a checkpoint."""
        return (self.eval_s or 0.0) * eval_at_end + (self.checkpoint_s or 0.0)

    def should_stop(self, eval_at_end: bool) -> bool:
        """Asked before a step: True when the step after it would not fit before the final evaluation
        and checkpoint (the loop stops once this step is done)."""
        if not self.enabled or self.last_step_s is None:
            return False
        # During the warm-up only its (slower) steps are known: in a limit that tight, erring early is right.
        step_s = self.step_time() if self.steps else self.last_step_s
        return time.time() + 2 * step_s + self.final_cost(eval_at_end) > self.deadline

    def plan(self, cfg, step: int) -> tuple[int, int, int]:
        """(max_steps, eval.every, checkpoint.every) that end the run at the deadline from `step`."""
        left = self.deadline - time.time() - self.final_cost(cfg.eval.at_end)
        old = cfg.train.max_steps
        eval_s, ckpt_s = self.eval_s or 0.0, self.checkpoint_s or 0.0
        # The counts the config asked for, kept as max_steps changes; but evaluations and checkpoints
        # never take more than OVERHEAD_SHARE of the time left (a cadence set for a first guess of
        # max_steps can ask for far more than the budget affords).
        n_evals = old / cfg.eval.every if cfg.eval.every else 0.0
        n_ckpts = old / cfg.checkpoint.every
        overhead = n_evals * eval_s + n_ckpts * ckpt_s
        if overhead > OVERHEAD_SHARE * max(left, 0.0):
            cut = OVERHEAD_SHARE * max(left, 0.0) / overhead
            n_evals, n_ckpts = n_evals * cut, n_ckpts * cut
        per_step = self.step_time() * MARGIN
        total = old
        for _ in range(3):  # the shares depend on the new length: a few fixed-point rounds settle it
            share_left = max(0, total - step) / max(total, 1)
            overhead = share_left * (n_evals * eval_s + n_ckpts * ckpt_s)
            total = step + max(1, int((left - overhead) / per_step))
        every = max(1, round(total / n_evals)) if cfg.eval.every and n_evals >= 1 else (total if cfg.eval.every else 0)
        return total, every, max(1, round(total / n_ckpts)) if n_ckpts >= 1 else total

    def planned(self) -> None:
        self.plans += 1
        self.steps_since_plan = 0

    def check_due(self, step: int, max_steps: int) -> bool:
        """Every CHECKS-th of the run, once planned: time to compare the projected end with the deadline."""
        return (self.enabled and self.plans > 0 and self.steps_since_plan >= MIN_STEPS_BETWEEN_PLANS
                and step % max(1, max_steps // CHECKS) == 0)

    def drifted(self, cfg, step: int) -> bool:
        """Whether the run, at today's step time, would end more than DRIFT of the budget off the deadline."""
        if not self.enabled or self.plans == 0 or not self.steps:
            return False
        steps_left = cfg.train.max_steps - step
        evals_left = steps_left // cfg.eval.every if cfg.eval.every else 0
        ckpts_left = steps_left // cfg.checkpoint.every
        projected = (time.time() + steps_left * self.step_time() + evals_left * (self.eval_s or 0.0)
                     + ckpts_left * (self.checkpoint_s or 0.0) + self.final_cost(cfg.eval.at_end))
        return abs(projected - self.deadline) > DRIFT * self.limit


def apply_plan(cfg, max_steps: int, eval_every: int, checkpoint_every: int):
    """The config with the plan's step count and cadences."""
    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, max_steps=max_steps),
        eval=dataclasses.replace(cfg.eval, every=eval_every),
        checkpoint=dataclasses.replace(cfg.checkpoint, every=checkpoint_every))
