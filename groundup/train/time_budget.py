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

`train.time_limit_file` lets another process move the limit while the run trains (the demo shortens
pretraining when the machine slows down and the stages after it will need longer): a JSON file
{"time_limit_s": seconds} (write_time_limit), read within REFRESH_S of a change. A moved deadline is
a drift like any other: the run re-plans to it while the schedule allows, and always stops by it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from pathlib import Path

from groundup.errors import GroundupError
from groundup.io import atomic_write_json, read_json

WARMUP_STEPS = 2  # steps of a session left out of the step time (allocation, kernel warm-up)
FIRST_PLAN_AFTER = 5  # steady steps timed before the first plan
WINDOW = 30  # recent steps the step time is taken over (the median: robust to a stray slow step)
MARGIN = 1.02  # steps planned at 2% over the measured time: the loop's own work between steps
DRIFT = 0.03  # re-plan when the projected end moves by more than this share of the budget
OVERHEAD_SHARE = 0.2  # at most this share of the time left goes to periodic evaluations and checkpoints
MIN_STEPS_BETWEEN_PLANS = 10  # new step times a re-plan needs (fewer: noise, not a change)
CHECKS = 40  # times per run the projection is checked (a broadcast from the main process each)
REFRESH_S = 1.0  # train.time_limit_file is looked at no more often than this


def write_time_limit(path: str | Path, seconds: float) -> None:
    """Move the limit of the run that reads `path` as its train.time_limit_file."""
    atomic_write_json(Path(path), {"time_limit_s": round(float(seconds), 1)})


class TimeBudget:
    def __init__(self, limit_s: float, began: float, start_step: int, limit_file: str = ""):
        self.limit = limit_s
        self.began = began
        self.deadline = began + limit_s
        self.limit_file = Path(limit_file) if limit_file else None
        self._file_seen: tuple[int, int] | None = None  # (mtime_ns, size) of the version last read
        self._file_checked = 0.0
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

    def refresh(self) -> dict | None:
        """A metrics.jsonl event when train.time_limit_file changed since it was read: the limit moved, or
        the new version was ignored (and why); None when nothing changed."""
        now = time.monotonic()
        if self.limit_file is None or not self.enabled or now - self._file_checked < REFRESH_S:
            return None
        self._file_checked = now
        try:
            st = self.limit_file.stat()
        except OSError:
            return None
        if (st.st_mtime_ns, st.st_size) == self._file_seen:
            return None
        self._file_seen = (st.st_mtime_ns, st.st_size)
        try:
            seconds = read_json(self.limit_file)["time_limit_s"]
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
                    math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"time_limit_s is {seconds!r}, not a positive number of seconds")
        except (GroundupError, KeyError, TypeError, ValueError) as e:
            why = "no time_limit_s key" if isinstance(e, KeyError) else str(e)
            return {"event": "time_limit_file_ignored", "file": str(self.limit_file), "reason": why}
        if seconds == self.limit:
            return None
        previous, self.limit = self.limit, float(seconds)
        self.deadline = self.began + self.limit
        return {"event": "time_limit_moved", "time_limit_s": self.limit, "previous_s": previous}

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
