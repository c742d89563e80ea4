"""How the demo's budget becomes each training stage's `train.time_limit_s`: every stage gets its least
first, then the rest is shared.

    budget minutes
      - what the stages so far took (measured)
      - the report-card rows still to come, at their measured price          (demo/costs.py)
      - the least of every training stage still to come, this one included: its start-up, a few steps
        and its evaluations, at the measured speed of this machine now       (demo/costs.py)
      - samples, exports, quantization and the report
      = the surplus, split pretrain : sft : align by DemoConfig.shares; each stage's limit is its least
        plus its share of the surplus

The costs are measured before pretraining is planned (demo/measure.py and the untrained model's row),
so a busy machine reserves more for what follows. While pretraining runs, demo/watch.py measures how
much slower (or faster) its steps have become and re-plans its limit with every cost scaled by that,
through train.time_limit_file: the load that arrives during pretraining is paid by pretraining, not by
SFT or alignment. When even the least of everything does not fit, the demo stops before pretraining and
names the smallest budget that would (DemoConfig.short_budget = "run": run every stage at its least
anyway); a budget that clearly cannot hold it is refused before the first stage, from one training step
measured then and the chain's least on a quiet reference machine (early_refusal). SFT and alignment are never skipped: if the load grows after pretraining, they run their few
steps and the demo overruns by that.

Each stage's plan is made when the stage starts, from the recorded times and results of the stages
before it (OUT/stages.json), so a rerun that reuses those stages plans the same limit and reuses the
stage too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from groundup.demo.costs import Costs

STAGES = ["pretrain", "sft", "align"]
ROWS_AFTER = {"pretrain": ["base", "sft", "aligned", "aligned-int8"], "sft": ["sft", "aligned", "aligned-int8"],
              "align": ["aligned", "aligned-int8"]}  # the report-card rows still to come when a stage starts
FIXED_AFTER = {"pretrain": ("samples", "exports", "quantize", "arena", "report"),
               "sft": ("exports", "quantize", "arena", "report"), "align": ("exports", "quantize", "arena", "report")}
FULL_CHAIN_ONLY = ("quantize", "arena")  # run only when the demo goes to its end (no `until`)
FULL_BUDGET_S = 15 * 60  # the scorecard's and the evaluations' item counts are given for a 15-minute demo
SAFETY = 1.1  # the smallest budget named holds what the measurements ask for, and a tenth more
MINUTES_STEP = 0.5  # the smallest budget is named in half minutes
# Before the first stage only a training step can be measured (a second or two). The least of the whole
# chain on a quiet 2-core AMD EPYC (2026-11-27), where that step of the demo's model took REFERENCE_STEP_S:
# REFERENCE_CHAIN_S[0] s that do not depend on the budget (the data stages, start-ups, a few steps each)
# plus REFERENCE_CHAIN_S[1] s times the budget's scale (the report-card rows and the evaluations).
REFERENCE_STEP_S = 0.53
REFERENCE_CHAIN_S = (80.0, 90.0)
EARLY_OPTIMISM = 0.5  # refused at the start only when even this share of that estimate overruns the budget


def budget_scale(minutes: float) -> float:
    """How the evaluation item counts scale with the budget (demo/scorecard.py)."""
    return min(1.0, minutes * 60 / FULL_BUDGET_S)


@dataclass
class StagePlan:
    stage: str
    seconds: float  # the stage's time limit
    left: float  # budget left when it started
    reserved: float  # the least of everything still to come, this stage included
    least: dict[str, float]  # the least of each training stage still to come
    rows: float  # the report-card rows still to come
    load: float  # load average per core when the costs were measured
    slowdown: float = 1.0  # of the machine since then
    short: bool = False  # the budget left cannot hold the least of what remains
    moves: list[dict] = field(default_factory=list)  # pretraining's re-plans while it ran (demo/watch.py)

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "budget_left": self.left, "reserved": self.reserved,
                "least": {k: round(v, 1) for k, v in self.least.items()}, "rows": round(self.rows, 1),
                "load": round(self.load, 2), "slowdown": round(self.slowdown, 2), "short": self.short,
                "moves": self.moves}


class DemoBudget:
    def __init__(self, cfg, runner):
        self.cfg, self.runner = cfg, runner
        self.total = cfg.budget_minutes * 60
        self.scale = budget_scale(cfg.budget_minutes)
        self.spent_before = 0.0  # seconds spent before the first stage (the early check's measurement)

    def left(self) -> float:
        """The budget less the recorded time of the stages so far."""
        return self.total - self.spent_before - sum(self.runner.times().values())

    def stages(self) -> list[str]:
        """The training stages this demo runs, in order."""
        return STAGES[: STAGES.index(self.cfg.until) + 1] if self.cfg.until else STAGES

    def rows_after(self, stage: str) -> list[str]:
        rows = ROWS_AFTER[stage]
        if self.cfg.until:  # no quantization, and no rows of stages that do not run
            names = {"pretrain": "base", "sft": "sft", "align": "aligned"}
            rows = [r for r in rows if r in [names[s] for s in self.stages()]]
        return rows

    def plan(self, stage: str, costs: Costs, left: float | None = None) -> StagePlan:
        """The time limit of training stage `stage` (see the module docstring); `left`: the budget left when
        it started (default: now)."""
        stages = self.stages()
        remaining = stages[stages.index(stage):]
        left = self.left() if left is None else left
        least = {s: costs.least(s, self.cfg, self.scale) for s in remaining}
        rows = sum(costs.row(name) for name in self.rows_after(stage))
        fixed = costs.fixed(*[f for f in FIXED_AFTER[stage] if f not in FULL_CHAIN_ONLY or not self.cfg.until
                              if f != "arena" or self.cfg.arena.enabled])
        reserved = rows + fixed + sum(least.values()) + costs.overrun_s * len(remaining)
        surplus = left - reserved
        shares = {s: getattr(self.cfg.shares, s) for s in remaining}
        seconds = least[stage] + max(0.0, surplus) * shares[stage] / sum(shares.values())
        return StagePlan(stage, round(seconds, 1), round(left, 1), round(reserved, 1), least, rows, costs.load,
                         costs.slowdown, short=surplus < 0)

    def smallest_minutes(self, plan: StagePlan) -> float:
        """The smallest budget, in minutes, whose plan would hold `plan`'s least of everything (a rerun
        with it redoes the stages so far: the chat data and the rows' item counts change with the budget)."""
        spent = self.total - plan.left
        minutes = math.ceil(self.cfg.budget_minutes / MINUTES_STEP) * MINUTES_STEP
        while True:
            # The report-card rows grow with the budget's scale (at most in proportion); the rest stays.
            grow = max(1.0, budget_scale(minutes) / self.scale)
            if (spent + plan.reserved + plan.rows * (grow - 1)) * SAFETY <= minutes * 60 or minutes >= 24 * 60:
                return minutes
            minutes += MINUTES_STEP

    def early_least(self, step_s: float, minutes: float | None = None) -> float:
        """The least of the whole chain, estimated before it starts from one measured training step."""
        scale = budget_scale(self.cfg.budget_minutes if minutes is None else minutes)
        return (REFERENCE_CHAIN_S[0] + REFERENCE_CHAIN_S[1] * scale) * step_s / REFERENCE_STEP_S

    def early_refusal(self, step_s: float) -> str | None:
        """Why the budget cannot hold the chain, known before it starts; None when it may (the measured plan
        before pretraining decides)."""
        need = self.early_least(step_s)
        if need * EARLY_OPTIMISM <= self.total:
            return None
        minutes = math.ceil(self.cfg.budget_minutes / MINUTES_STEP) * MINUTES_STEP
        while self.early_least(step_s, minutes) * EARLY_OPTIMISM * SAFETY > minutes * 60 and minutes < 24 * 60:
            minutes += MINUTES_STEP
        return (f"a {self.cfg.budget_minutes:g}-minute budget cannot hold the whole chain on this machine now: a "
                f"training step of the pretraining model took {step_s:.2f} s ({REFERENCE_STEP_S:g} s on a quiet "
                f"2-core machine), so the data stages, a few steps of each training stage and the report-card "
                f"rows need about {need:.0f} s. The smallest budget that may work now: {minutes:g} minutes "
                f"(--budget-minutes {minutes:g}; the plan measured before pretraining says exactly); or "
                "short_budget=run to run every stage for its few steps anyway")

    def refusal(self, plan: StagePlan) -> str:
        least = ", ".join(f"{s} {v:.0f} s" for s, v in plan.least.items())
        minutes = self.smallest_minutes(plan)
        return (f"a {self.cfg.budget_minutes:g}-minute budget cannot hold the whole chain on this machine now "
                f"(load {plan.load:.1f} per core): the stages so far took {self.total - plan.left:.0f} s, and what "
                f"follows needs at least {plan.reserved:.0f} s (a few steps each: {least}; the report-card rows "
                f"{plan.rows:.0f} s), {plan.reserved - plan.left:.0f} s more than is left. The smallest budget "
                f"that works now: {minutes:g} minutes (--budget-minutes {minutes:g}); or short_budget=run to run "
                "every stage for its few steps anyway")
