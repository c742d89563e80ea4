"""One optimizer step of any objective: micro-batches in, one (or no) update out.

Order matters and is tested:
1. Fetch all micro-batches and pass each through the objective's data gate; count the units of the
   whole step on every process (one all-reduce), so the loss is the mean over the step's units
   however they are split between micro-batches and processes.
2. Set the learning rate for this step, before anything can call `optimizer.step()`.
3. Forward and backward each micro-batch, scaling its mean loss by its share of the step's
   units; data-parallel gradients are all-reduced only after the last micro-batch. With pipeline
   stages (distributed.pp) the schedule of pipeline.py runs them, and the loss comes from the last stage.
4. Global gradient norm before clipping; the spike guard decides whether the update happens.
5. Clip, `optimizer.step()`, MoE bias update (load summed over processes), zero gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from groundup.train.distributed import grad_sync, total_norm
from groundup.train.objective import batch_tokens
from groundup.train.pipeline import pipeline_step
from groundup.train.state import TrainState, weights_finite


@dataclass
class StepResult:
    lr: float
    loss: float  # the objective's "loss" metric: mean over the step's units, all processes
    metrics: dict[str, float]  # every metric of the objective, the same kind of mean ("loss" first)
    grad_norm: float  # before clipping
    grad_norm_clipped: float
    skipped: str | None  # why the update was skipped, or None
    broken: bool  # the update left non-finite weights: only a rollback can continue
    gated: int  # sequences the data gate dropped, all processes
    stop: bool  # some process received SIGINT/SIGTERM
    tokens: int  # tokens the step consumed, all processes
    docs: list = field(default_factory=list)  # this process's (rows' documents) per micro-batch
    gated_rows: list = field(default_factory=list)  # this process's (micro-batch, row) pairs dropped


def train_step(state: TrainState, stop_requested: bool = False) -> StepResult:
    """Run optimizer step `state.step` (0-based); the caller advances the counters."""
    cfg, d, precision, objective = state.cfg, state.dist, state.precision, state.objective
    gate = getattr(objective, "gate", None)
    micro, gated_rows = [], []
    for i in range(cfg.train.grad_accum):
        batch = next(state.loader)
        if gate is not None:
            batch, dropped = gate(batch)
            gated_rows += [(i, r) for r in dropped]
        micro.append(batch)
    counts = [objective.units(b) for b in micro]
    tokens = sum(batch_tokens(objective, b) for b in micro)
    n_total, n_gated, tokens = d.sum([sum(counts), len(gated_rows), tokens])
    lr = state.schedule.apply(state.optimizers, state.step)

    extra: dict[str, float] = {}
    if d.pp > 1:  # the pipeline's schedule runs every micro-batch; the loss sums come from the last stage
        sums, extra = pipeline_step(state, micro, n_total)
    else:
        sums = _forward_backward(state, micro, counts, n_total)

    names = list(sums)
    *totals, stop = d.sum([float(sums[k]) for k in names] + [float(stop_requested)])
    metrics = {k: (v / n_total if n_total else float("nan")) for k, v in zip(names, totals)}
    metrics.update(extra)
    loss = metrics.get("loss", float("nan"))
    params = [p for p in precision.master.parameters() if p.grad is not None]
    norm = total_norm([p.grad for p in params], d.pp)
    skipped = ("nothing to learn from: every sequence was dropped by the data gate or carried no signal" if not n_total
               else state.guard.judge(state.step, loss, norm))
    broken = False
    clip = cfg.optim.grad_clip
    coef = min(1.0, clip / (norm + 1e-6)) if clip and skipped is None else 1.0
    if skipped is None:
        if coef < 1.0:
            for p in params:
                p.grad.mul_(coef)
        for opt in state.optimizers:
            opt.step()
        _update_moe(state)
        precision.master_to_compute()
        broken = not weights_finite(state)
        if broken:  # e.g. a learning rate far too high: finite gradients, an update that overflows
            skipped = "the update made weights non-finite"
            state.guard.record_broken(state.step)
    else:
        for moe in state.compute_moe:
            moe.load.zero_()  # a skipped step's routing does not count toward balancing
    precision.zero_grad()
    return StepResult(lr, loss, metrics, norm, norm * coef, skipped, broken, int(n_gated), bool(stop), int(tokens),
                      [getattr(b, "docs", []) for b in micro], gated_rows)


def _forward_backward(state: TrainState, micro: list, counts: list[int], n_total: float) -> dict[str, torch.Tensor]:
    """Forward and backward of each micro-batch on this process; the metrics' sums weighted by units."""
    cfg, d, precision, objective = state.cfg, state.dist, state.precision, state.objective
    sums: dict[str, torch.Tensor] = {}
    for i, (batch, n) in enumerate(zip(micro, counts)):
        last = i == len(micro) - 1
        with grad_sync(state.model, d, last, cfg.distributed.fsdp_grad_sync == "every"):
            with precision.context():
                out = objective(state.step_model, batch, d.device)
            # DDP and FSDP average gradients over processes, hence the world size.
            scale = n * d.world_size / n_total if n_total else 0.0
            (out.loss * scale).backward()
        for name, value in out.metrics.items():
            value = torch.as_tensor(value).detach().double().cpu() * n
            sums[name] = sums[name] + value if name in sums else value
        if precision.split and d.strategy == "single":
            precision.grads_to_master()  # accumulate micro-batches in fp32
    if precision.split and d.strategy != "single":
        precision.grads_to_master()  # DDP reduced the bf16 gradients at the last micro-batch
    return sums


def _update_moe(state: TrainState) -> None:
    """Auxiliary-loss-free balancing: nudge each MoE layer's bias by the load of all processes."""
    rate = state.model_cfg.moe_bias_update_rate
    for master, compute in zip(state.master_moe, state.compute_moe):
        load = state.dist.sum_tensor(compute.load.clone())
        master.update_bias(rate, load)
        compute.load.zero_()
