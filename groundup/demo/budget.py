"""How the demo's budget becomes each training stage's `train.time_limit_s`, from what came before.

    budget minutes
      - what the stages so far took (measured)
      - the report-card rows still to come, each costing the dearest row measured so far (the untrained
        model's row is scored before pretraining for that: its replies always run to the token limit)
      - each training stage still to come, this one included, costs its limit plus what a training
        stage took beyond its limit so far (start-up, data preparation, the final evaluation and
        checkpoint; DEFAULT_OVERHEAD_S before any was measured)
      - quantization and the report (small, fixed)
      = training time, split pretrain : sft : align by DemoConfig.shares

Each stage's limit is decided when the stage starts, from the recorded times of the stages before
it (OUT/stages.json), so a rerun that reuses those stages plans the same limit and reuses the stage
too. Within its limit, a training stage re-plans its own step count from its measured steps
(train/time_budget.py), so the demo keeps to its budget on a quiet machine and a busy one alike.
"""

from __future__ import annotations

from dataclasses import dataclass

ROW_MARGIN = 1.1  # a later row may take a little longer than the first (longer replies, a slower kernel)
FIXED_SECONDS = {"quantize": 3.0, "report": 4.0}
MIN_STAGE_SECONDS = 2.0  # a stage always gets a few steps, even in a budget that is already spent
DEFAULT_OVERHEAD_S = 5.0  # a training verb's start-up and final evaluation before one was measured


@dataclass
class StagePlan:
    seconds: float  # the stage's time limit
    left: float  # budget left when it started
    reserved: float  # kept for what follows the training stages
    spent: bool = False  # nothing was left for it: it would only overrun the budget (see PostStages.skip)


class DemoBudget:
    def __init__(self, cfg, runner):
        self.cfg, self.runner = cfg, runner
        self.total = cfg.budget_minutes * 60
        self.limits: dict[str, float] = {}  # the limit each training stage was given

    def left(self) -> float:
        """The budget less the recorded time of the stages so far (see the module docstring)."""
        return self.total - sum(self.runner.times().values())

    def _stages(self) -> list[str]:
        """The training stages this demo runs, in order."""
        order = ["pretrain", "sft", "align"]
        return order[: order.index(self.cfg.until) + 1] if self.cfg.until else order

    def _rows(self) -> int:
        return len(self._stages()) + (0 if self.cfg.until else 1)  # + the quantized model's row

    def _reserve(self, row_seconds: float | None, rows_done: int) -> float:
        rows_left = self._rows() - rows_done
        rows = (rows_left * row_seconds * ROW_MARGIN if row_seconds is not None
                else self.cfg.shares.evaluation * self.total * rows_left / self._rows())
        fixed = FIXED_SECONDS["report"] + (0.0 if self.cfg.until else FIXED_SECONDS["quantize"])
        return rows + fixed

    def overhead(self) -> float:
        """Seconds a training stage takes beyond its limit: the most any finished one took."""
        times = self.runner.times()
        seen = [times[s] - limit for s, limit in self.limits.items() if s in times]
        return max(0.0, *seen) if seen else DEFAULT_OVERHEAD_S

    def plan(self, stage: str, row_seconds: float | None = None, rows_done: int = 0) -> StagePlan:
        """The time limit of training stage `stage`; `row_seconds`: the dearest report-card row measured."""
        stages = self._stages()
        shares = {s: getattr(self.cfg.shares, s) for s in stages[stages.index(stage):]}
        left = self.left()
        reserved = self._reserve(row_seconds, rows_done) + self.overhead() * len(shares)
        wanted = (left - reserved) * shares[stage] / sum(shares.values())
        seconds = round(max(MIN_STAGE_SECONDS, wanted), 1)
        self.limits[stage] = seconds
        return StagePlan(seconds, round(left, 1), round(reserved, 1), spent=wanted < MIN_STAGE_SECONDS)
