"""One optimizer step: micro-batches in, one (or no) update out.

Order matters and is tested:
1. Fetch all micro-batches and pass each through the data gate; count the valid targets of the
   whole step on every process (one all-reduce), so the loss is the mean over the step's tokens
   however they are split between micro-batches and processes.
2. Set the learning rate for this step, before anything can call `optimizer.step()`.
3. Forward and backward each micro-batch, scaling its mean loss by its share of the step's
   tokens; data-parallel gradients are all-reduced only after the last micro-batch.
4. Global gradient norm before clipping; the spike guard decides whether the update happens.
5. Clip, `optimizer.step()`, MoE bias update (load summed over processes), zero gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from groundup.tokens.loader import IGNORE_INDEX
from groundup.train.distributed import grad_sync, total_norm
from groundup.train.stability import gate_batch


@dataclass
class StepResult:
    lr: float
    loss: float  # mean cross-entropy over the step's valid targets, all processes
    z_loss: float
    grad_norm: float  # before clipping
    grad_norm_clipped: float
    skipped: str | None  # why the update was skipped, or None
    gated: int  # sequences the data gate dropped, all processes
    stop: bool  # some process received SIGINT/SIGTERM
    docs: list = field(default_factory=list)  # this process's (rows' documents) per micro-batch
    gated_rows: list = field(default_factory=list)  # this process's (micro-batch, row) pairs dropped


def train_step(t, step: int, stop_requested: bool) -> StepResult:
    """Run optimizer step `step` (0-based) with the trainer state `t` (see loop.py)."""
    cfg, d, precision = t.cfg, t.dist, t.precision
    micro, gated_rows = [], []
    for i in range(cfg.train.grad_accum):
        batch, dropped = gate_batch(next(t.loader), cfg.stability)
        micro.append(batch)
        gated_rows += [(i, r) for r in dropped]
    counts = [int((b.targets != IGNORE_INDEX).sum()) for b in micro]
    n_total, n_gated = d.sum([sum(counts), len(gated_rows)])
    lr = t.schedule.apply(t.optimizers, step)

    ce_sum = torch.zeros((), dtype=torch.float64)
    z_sum = torch.zeros((), dtype=torch.float64)
    for i, (batch, n) in enumerate(zip(micro, counts)):
        last = i == len(micro) - 1
        with grad_sync(t.model, d, last):
            with precision.context():
                out = t.step_model(batch.inputs.to(d.device, non_blocking=True),
                                   batch.targets.to(d.device, non_blocking=True))
            # DDP and FSDP average gradients over processes, hence the world size.
            scale = n * d.world_size / n_total if n_total else 0.0
            (out.loss * scale).backward()
        ce_sum += out.ce_loss.double().cpu() * n
        z_sum += out.z_loss.double().cpu() * n
        if precision.split and d.strategy == "single":
            precision.grads_to_master()  # accumulate micro-batches in fp32
    if precision.split and d.strategy != "single":
        precision.grads_to_master()  # DDP reduced the bf16 gradients at the last micro-batch

    ce_total, z_total, stop = d.sum([float(ce_sum), float(z_sum), float(stop_requested)])
    loss = ce_total / n_total if n_total else float("nan")
    params = [p for p in precision.master.parameters() if p.grad is not None]
    norm = total_norm([p.grad for p in params])
    skipped = "every sequence was dropped by the data gate" if not n_total else t.guard.judge(step, loss, norm)
    clip = cfg.optim.grad_clip
    coef = min(1.0, clip / (norm + 1e-6)) if clip and skipped is None else 1.0
    if skipped is None:
        if coef < 1.0:
            for p in params:
                p.grad.mul_(coef)
        for opt in t.optimizers:
            opt.step()
        _update_moe(t)
        precision.master_to_compute()
    else:
        for moe in t.compute_moe:
            moe.load.zero_()  # a skipped step's routing does not count toward balancing
    precision.zero_grad()
    return StepResult(lr, loss, z_total / n_total if n_total else float("nan"), norm, norm * coef, skipped,
                      int(n_gated), bool(stop), [b.docs for b in micro], gated_rows)


def _update_moe(t) -> None:
    """Auxiliary-loss-free balancing: nudge each MoE layer's bias by the load of all processes."""
    rate = t.cfg.model.moe_bias_update_rate
    for master, compute in zip(t.master_moe, t.compute_moe):
        load = t.dist.sum_tensor(compute.load.clone())
        master.update_bias(rate, load)
        compute.load.zero_()
