"""Learning-rate schedules: linear warmup, then cosine to a floor, warmup-stable-decay, or constant.

The rate is a pure function of the optimizer step, so resuming needs only the step and the
rollback factor. The loop calls `apply(optimizers, step)` *before* `optimizer.step()` for that
step (setting it after is a silent off-by-one that a published 7B project shipped), and exactly
once per optimizer step, never per micro-batch.

    step s (0-based) of max_steps, warmup W = min(warmup_steps, warmup_max_fraction * max_steps):
      s < W           peak * (s + 1) / W
      cosine          floor + (peak - floor) * (1 + cos(pi * p)) / 2,   p = (s - W) / (max_steps - W)
      wsd             peak until the last decay_fraction of steps, then down to floor by decay_shape
      constant        peak
"""

from __future__ import annotations

import math

from groundup.train.config import ScheduleConfig


def warmup_steps(cfg: ScheduleConfig, max_steps: int) -> int:
    return min(cfg.warmup_steps, int(cfg.warmup_max_fraction * max_steps))


def _decay(shape: str, p: float) -> float:
    """From 1 at p = 0 to 0 at p = 1."""
    p = min(max(p, 0.0), 1.0)
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    return 1.0 - math.sqrt(p)  # "sqrt": the 1-sqrt cooldown of Hägele et al. (2024)


def lr_at(cfg: ScheduleConfig, step: int, max_steps: int) -> float:
    """The learning rate for 0-based optimizer step `step` of a run of `max_steps`."""
    warm = warmup_steps(cfg, max_steps)
    if step < warm:
        return cfg.peak_lr * (step + 1) / warm
    if cfg.kind == "constant":
        return cfg.peak_lr
    if cfg.kind == "cosine":
        p = (step - warm) / max(1, max_steps - 1 - warm)
        return cfg.min_lr + (cfg.peak_lr - cfg.min_lr) * _decay("cosine", p)
    decay_steps = max(1, round(cfg.decay_fraction * max_steps))
    start = max_steps - decay_steps
    if step < start:
        return cfg.peak_lr
    p = (step - start + 1) / decay_steps
    return cfg.min_lr + (cfg.peak_lr - cfg.min_lr) * _decay(cfg.decay_shape, p)


class Schedule:
    """The schedule plus the rollback factor: what a checkpoint must remember of it."""

    def __init__(self, cfg: ScheduleConfig, max_steps: int):
        self.cfg, self.max_steps = cfg, max_steps
        self.lr_factor = 1.0  # lowered at each rollback

    def lr(self, step: int) -> float:
        return lr_at(self.cfg, step, self.max_steps) * self.lr_factor

    def apply(self, optimizers, step: int) -> float:
        """Set every param group's rate for `step`; returns it."""
        lr = self.lr(step)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        return lr

    def may_change_length(self, step: int, new_max_steps: int) -> bool:
        """Whether `max_steps` can still change at `step` without a jump that matters in the rate:
        WSD before its decay begins (under either length), cosine in its first half, constant always."""
        if self.cfg.kind == "constant":
            return True
        if self.cfg.kind == "wsd":
            return all(step < n - max(1, round(self.cfg.decay_fraction * n)) for n in (self.max_steps, new_max_steps))
        return step < 0.5 * min(self.max_steps, new_max_steps)

    def state_dict(self) -> dict:
        return {"lr_factor": self.lr_factor}

    def load_state_dict(self, state: dict) -> None:
        self.lr_factor = float(state["lr_factor"])
