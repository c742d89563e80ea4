"""Pipeline parallelism with torch.distributed.pipelining: the transformer's blocks split into stages, by hand.

    torchrun --nproc-per-node 4 -m groundup train ... distributed.strategy=fsdp distributed.pp=2 \\
        distributed.pp_schedule=1f1b distributed.pp_microbatches=4          # PP 2 x FSDP2 2

The promise: a pipelined run takes the steps a one-process run takes (the same losses and weights
within float rounding) and its checkpoints hold the one-process model's parameter names.

Stages. The `n_layers` blocks are cut into pp x v equal stages (v = `distributed.pp_virtual_stages`,
2 by default for interleaved 1F1B, else 1); process p of the pipeline holds stages p, p + pp, ... (the
looped order ScheduleInterleaved1F1B expects). Stage 0 also holds the embedding; the last stage the
final norm and the output layer, and returns float32 logits that `loss_fn` turns into the step's
loss. Each stage is a `StageModule` built from the whole model's own modules (no tracing), its
blocks tensor-parallel over the stage's tp mesh when `distributed.tp` > 1 (parallelize.py, each
stage on its own), then sharded with FSDP2 (each block, then the stage) over the stage's
data-parallel mesh, and driven by a `PipelineStage` and one of ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B.

Tied embeddings (model.tie_embeddings). The first and the last stage each hold the embedding matrix
(the last as its output layer), under the one name `embed.weight`, sharded alike. After each step's
backward their gradients are summed over a group of the two ends' processes at the same data- and
tensor-parallel coordinate (`tied_group`, `sync_tied_grads`), so both copies take the one-process
model's update and stay equal; the gradient norm counts that gradient once, and checkpoints hold it
once (DCP keeps one of two identical shards).

Names. `PipelineModel` is what the training state holds: this process's embedding, blocks (an
nn.ModuleDict keyed by the layer's index), norm and output layer registered under the whole model's
names (`blocks.3.attn.qkv_proj.weight`), so its optimizer and DCP checkpoints use the same fully
qualified names as a one-process run, and a PP checkpoint resumes under FSDP, one process or other
stage counts. Every process writes its own stages' shards; the checkpoint's index holds them all.

The step. The micro-batches of one optimizer step (train.grad_accum loader batches) are concatenated
and the schedule splits them into grad_accum x pp_microbatches pipeline micro-batches. `loss_fn`
returns each one's mean loss times its share of the step's units (times the data-parallel size,
which FSDP divides out), with `scale_grads=False`: the gradients are exactly the one-process step's.
Only the last stage sees the loss: its sums are all-reduced over the pipeline group, so every
process logs it and the spike guard judges the same number; the gradient norm sums every stage's
squares (distributed.total_norm with `pp`), so clipping scales every stage alike.

Bubble. The share of a step a stage idles waiting for its neighbours is, in theory, (p - 1) / (m + p - 1)
for GPipe and 1F1B with m micro-batches per step, and (p - 1) / (v m + p - 1) for interleaved 1F1B
with v stages per process. Each logged step carries that (`pp_bubble`) and the measured idle share
(`pp_idle`: 1 - the time in stage forward/backward over the schedule's wall time, mean over processes).

Not pipelined here: mixture-of-experts layers, expert parallelism, meta-device initialisation,
torch.compile, validation during training (evaluate a checkpoint instead), and objectives other
than pretraining's next-token loss. Each is refused, naming the key.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from groundup.errors import ConfigError
from groundup.model.attention import build_mask
from groundup.model.loss import IGNORE_INDEX, cross_entropy_with_z
from groundup.model.transformer import Transformer
from groundup.train.parallelize import split_names, tensor_parallel


def virtual_stages(dc) -> int:
    return dc.pp_virtual_stages or (2 if dc.pp_schedule == "interleaved_1f1b" else 1)


def microbatches(dc) -> int:
    """Pipeline micro-batches each loader batch is split into."""
    return dc.pp_microbatches or dc.pp


def bubble_fraction(schedule: str, pp: int, m: int, v: int = 1) -> float:
    """The idle share of a step in theory: (p-1)/(m+p-1); interleaved 1F1B (p-1)/(v*m+p-1)."""
    if pp == 1:
        return 0.0
    return (pp - 1) / ((v if schedule == "interleaved_1f1b" else 1) * m + pp - 1)


def check_pp(cfg, model_cfg) -> None:
    """Refuse, naming the key, what this pipeline cannot run (`cfg`: a run config; `model_cfg`: its model)."""
    dc = cfg.distributed
    if dc.pp == 1:
        return
    v = virtual_stages(dc)
    if model_cfg is not None:
        if model_cfg.n_layers % (dc.pp * v):
            key = "distributed.pp_virtual_stages" if v > 1 else "distributed.pp"
            raise ConfigError(f"distributed.pp x virtual stages = {dc.pp} x {v} must divide model.n_layers "
                              f"({model_cfg.n_layers}): every stage holds the same number of blocks", key=key)
        if model_cfg.n_experts:
            raise ConfigError("distributed.pp > 1 with model.n_experts > 0: mixture-of-experts layers are not "
                              "pipelined here (their balancing spans every stage); use distributed.ep",
                              key="distributed.pp")
    batch = getattr(cfg.train, "batch_size", None)
    if batch is not None and batch % microbatches(dc):
        raise ConfigError(f"distributed.pp_microbatches = {microbatches(dc)} must divide train.batch_size ({batch}): "
                          "each pipeline micro-batch is an equal share of a loader batch",
                          key="distributed.pp_microbatches")
    for key, on in (("train.compile", cfg.train.compile), ("distributed.meta_init", dc.meta_init)):
        if on:
            raise ConfigError(f"{key} = true with distributed.pp > 1 is not supported; set it false", key=key)
    ev = getattr(cfg, "eval", None)
    if ev is not None and (ev.every or ev.at_end):
        raise ConfigError("distributed.pp > 1: validation during training is not pipelined; set eval.every = 0 and "
                          "eval.at_end = false, and evaluate the checkpoints (groundup eval)",
                          key="eval.every" if ev.every else "eval.at_end")


@dataclass
class Layout:
    pp: int  # pipeline processes
    v: int  # stages per process
    rank: int  # this process's place in the pipeline
    schedule: str
    microbatches: int  # per optimizer step: grad_accum x pp_microbatches

    @property
    def stages(self) -> list[int]:
        return [self.rank + i * self.pp for i in range(self.v)]

    @property
    def bubble(self) -> float:
        return bubble_fraction(self.schedule, self.pp, self.microbatches, self.v)


class StageModule(nn.Module):
    """Stage `index` of `total`: the whole model's embedding (first), blocks `layers`, norm and output layer (last)."""

    def __init__(self, model: nn.Module, index: int, total: int, layers: range):
        super().__init__()
        self.cfg, self.stage_index = model.cfg, index
        self.is_first, self.is_last = index == 0, index == total - 1
        # Tied embeddings: the last stage holds its own copy of the embedding matrix as its output layer.
        self.embed = model.embed if self.is_first or (self.is_last and model.lm_head is None) else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        self.norm = model.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None
        self.grad_checkpointing = model.grad_checkpointing
        self.register_buffer("rope_cos", model.rope_cos, persistent=False)
        self.register_buffer("rope_sin", model.rope_sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (first stage) or hidden states in; hidden states out, or float32 logits (last stage)."""
        cfg = self.cfg
        if self.is_first:
            x = self.embed(x)
            if cfg.embed_scale:
                x = x * math.sqrt(cfg.d_model)
        T = x.shape[1]
        cos, sin = self.rope_cos[:T].to(x.dtype), self.rope_sin[:T].to(x.dtype)
        mask = build_mask(T, 0, None, x.device)
        for block in self.blocks.values():
            if self.grad_checkpointing and self.training:
                x, _ = checkpoint(block, x, cos, sin, mask, None, use_reentrant=False)
            else:
                x, _ = block(x, cos, sin, mask, None)
        if not self.is_last:
            return x
        if self.norm is not None:
            x = self.norm(x)
        logits = F.linear(x, (self.embed if self.lm_head is None else self.lm_head).weight).float()
        cap = cfg.final_logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits


class PipelineModel(nn.Module):
    """This process's stages under the whole model's parameter names; the schedule drives `parts`."""

    def __init__(self, model: nn.Module, parts: list[StageModule], layout: Layout):
        super().__init__()
        self.cfg, self.layout = model.cfg, layout
        first, last = any(p.is_first for p in parts), any(p.is_last for p in parts)
        self.tied = model.lm_head is None  # the first and last stage each hold `embed.weight`
        self.embed = model.embed if first or (last and self.tied) else None
        blocks = sorted(((k, b) for p in parts for k, b in p.blocks.items()), key=lambda kv: int(kv[0]))
        self.blocks = nn.ModuleDict(blocks)
        self.norm = model.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.parts = parts  # a plain list: the stages' modules are registered above, once, by their names
        self.runtime: _Runtime | None = None  # the PipelineStages and the schedule, built at the first step
        self._flops_cfg = model.cfg

    def moe_layers(self) -> list:
        return []  # refused with pipelining (check_pp)

    @property
    def flops_model(self) -> nn.Module:
        """The whole model on the meta device: FLOPs per token count every stage (utilization is per process)."""
        with torch.device("meta"):
            return Transformer(self._flops_cfg)

    def forward(self, *args, **kwargs):
        raise RuntimeError("a pipelined model runs through its schedule (pipeline.pipeline_step), not forward()")


def pipeline_model(model: nn.Module, d, cfg, objective) -> PipelineModel:
    """Cut the whole model (built alike on every process) into this process's stages."""
    check_pp(cfg, model.cfg)
    if getattr(objective, "name", None) != "next_token":
        raise ConfigError(f"distributed.pp > 1 runs pretraining's next-token loss only, not {objective.name!r}; "
                          "set distributed.pp = 1", key="distributed.pp")
    dc = cfg.distributed
    layout = Layout(dc.pp, virtual_stages(dc), d.pp_rank, dc.pp_schedule, cfg.train.grad_accum * microbatches(dc))
    total, per = layout.pp * layout.v, model.cfg.n_layers // (layout.pp * layout.v)
    parts = [StageModule(model, s, total, range(s * per, (s + 1) * per)) for s in layout.stages]
    return PipelineModel(model, parts, layout)


def shard_stages(pm: PipelineModel, tp_mesh=None, sequence_parallel: bool = False, **kwargs) -> PipelineModel:
    """Tensor parallelism over `tp_mesh` (when given) on each stage's blocks, then FSDP2 (or HSDP, by the mesh
    in `kwargs`) on each block and on each stage: each stage is an FSDP root."""
    from torch.distributed.fsdp import fully_shard

    if tp_mesh is not None:
        # Each stage is parallelised on its own: with sequence parallelism its first block splits the
        # sequence and its last gathers it back, so stages pass whole hidden states to each other.
        for part in pm.parts:
            tensor_parallel(part, tp_mesh, sequence_parallel)
        # Checkpoints name every stage's split projections (meta.json's layout is written by one process):
        # every block splits alike, so this stage's blocks give the pattern for all of them.
        local = split_names(pm)
        pm.split_layout = {re.sub(r"^blocks\.\d+\.", f"blocks.{i}.", k): v
                           for i in range(pm.cfg.n_layers) for k, v in local.items()}
    for part in pm.parts:
        for block in part.blocks.values():
            fully_shard(block, **kwargs)
        fully_shard(part, **kwargs)
    return pm


# ----------------------------------------------------------------------------- tied embeddings


def tied_group(pm: PipelineModel, d):
    """The group of this process and its partner at the pipeline's other end holding the tied embedding
    (the first and last stage's processes at the same data- and tensor-parallel coordinate); None when
    the embeddings are untied or this process holds neither end. Collective: every process calls it."""
    if not pm.tied:
        return None
    inner = d.processes // d.pp  # the mesh's pp dimension is outermost: stage s's processes are s*inner ...
    group, _ = dist.new_subgroups_by_enumeration([[j, (d.pp - 1) * inner + j] for j in range(inner)])
    return group if pm.embed is not None else None


def sync_tied_grads(pm: PipelineModel, group) -> None:
    """Sum the embedding's gradient over the first and last stage, so both copies take the same update.

    Both ends shard the matrix over the same data-parallel mesh, so the local shards line up and one
    all-reduce of them is the whole sum. The gradient is then marked as held twice, so the gradient
    norm (distributed.total_norm) counts it once."""
    if group is None:
        return
    grad = pm.embed.weight.grad
    with torch.no_grad():
        dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)
    grad.pp_copies = 2


def tied_copies_differ(pm: PipelineModel, group) -> float:
    """The largest difference between this process's copy of the tied embedding and its partner's (0.0
    when they are equal, or with no partner). Collective over `group` (see tied_group)."""
    if group is None:
        return 0.0
    w = pm.embed.weight
    mine = (w.to_local() if hasattr(w, "to_local") else w).detach()
    theirs = [torch.empty_like(mine) for _ in range(2)]
    dist.all_gather(theirs, mine.contiguous(), group=group)
    return float((theirs[0] - theirs[1]).abs().max())


# ----------------------------------------------------------------------------- the step


class _Runtime:
    """The PipelineStages, the schedule, and what `loss_fn` adds up during one step."""

    def __init__(self, pm: PipelineModel, d):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        layout = pm.layout
        total = layout.pp * layout.v
        self.tied = tied_group(pm, d)
        self.stages = [PipelineStage(p, p.stage_index, total, d.device, group=d.pp_group) for p in pm.parts]
        self.has_first = any(p.is_first for p in pm.parts)
        self.z_coef = pm.cfg.z_loss_coef
        self.scale = 0.0
        self.records: list[torch.Tensor] = []  # units x (ce, z) of each micro-batch loss_fn saw
        self.microbatches = layout.microbatches
        self.busy = 0.0
        for stage in self.stages:  # time spent computing, for the measured idle share
            stage.forward_one_chunk = self._timed(stage.forward_one_chunk)
            stage.backward_one_chunk = self._timed(stage.backward_one_chunk)
        kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}
        kind = kinds[layout.schedule]
        self.schedule = kind(self.stages if layout.schedule == "interleaved_1f1b" else self.stages[0],
                             n_microbatches=layout.microbatches, loss_fn=self.loss_fn, scale_grads=False)

    def _timed(self, fn):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.busy += time.perf_counter() - started
        return run

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """A micro-batch's mean loss times its share of the step's units (and the data-parallel size)."""
        if logits.device.type == "meta":
            return logits.sum() * 0.0
        flat = targets.reshape(-1)
        units = int((flat != IGNORE_INDEX).sum())
        if not units:
            self.records.append(torch.zeros(2, dtype=torch.float64))
            return logits.sum() * 0.0
        loss, ce, z = cross_entropy_with_z(logits.reshape(-1, logits.shape[-1]), flat, self.z_coef)
        self.records.append(torch.stack([ce, z]).detach().double().cpu() * units)
        return loss * (units * self.scale)


def pipeline_step(state, micro: list, n_total: float) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Forward and backward of one optimizer step's micro-batches through the pipeline.

    Returns (metric sums weighted by units, as train_step adds them up: the same on every process;
    the bubble metrics)."""
    pm, d = state.model, state.dist
    if pm.runtime is None:
        pm.runtime = _Runtime(pm, d)
    rt = pm.runtime
    inputs = torch.cat([b.inputs for b in micro]).to(d.device, non_blocking=True)
    targets = torch.cat([b.targets for b in micro]).to(d.device, non_blocking=True)
    rt.scale = d.world_size / n_total if n_total else 0.0  # FSDP averages over the data-parallel processes
    rt.records.clear()
    rt.busy = 0.0
    started = time.perf_counter()
    with state.precision.context():
        if rt.has_first:
            rt.schedule.step(inputs, target=targets, return_outputs=False)
        else:
            rt.schedule.step(target=targets, return_outputs=False)
    wall = time.perf_counter() - started
    sync_tied_grads(pm, rt.tied)
    on = d.device if d.device.type == "cuda" else torch.device("cpu")
    # The first step's shape inference calls loss_fn on placeholder data first: the step's own calls come last.
    records = rt.records[-rt.microbatches:] if any(p.is_last for p in pm.parts) else []
    sums = sum(records, torch.zeros(2, dtype=torch.float64)).to(on)
    dist.all_reduce(sums, group=d.pp_group)  # only the last stage's process adds anything
    idle = torch.tensor([max(0.0, 1.0 - rt.busy / wall) if wall > 0 else 0.0], dtype=torch.float64, device=on)
    dist.all_reduce(idle)
    sums = sums.cpu()
    return ({"loss": sums[0], "z_loss": sums[1]},
            {"pp_bubble": pm.layout.bubble, "pp_idle": float(idle) / d.processes})


# ----------------------------------------------------------------------------- state dicts


def own_state(model: nn.Module, state: dict) -> dict:
    """The entries of a whole model's state (or optimizer `state`) that this process's stages hold."""
    names = set(model.state_dict())
    return {k: v for k, v in state.items() if k in names}


def own_param_groups(model: nn.Module, groups: list[dict]) -> list[dict]:
    names = {n for n, _ in model.named_parameters()}
    return [{**g, "params": [p for p in g["params"] if p in names]} for g in groups]


def merge_groups(everyone: list[dict]) -> dict:
    """Every process's optimizer {"param_groups", "scalars"} as one: a group's parameters from every stage.

    Groups with the same hyperparameters are one group (each stage has its own 'decay' and 'no_decay'
    groups); parameter names are listed once, in stage order."""
    merged: list[dict] = []
    scalars: dict = {}
    for part in everyone:
        for group in part["param_groups"]:
            same = next((g for g in merged if _hyper(g) == _hyper(group)), None)
            if same is None:
                merged.append({**group, "params": list(group["params"])})
            else:
                same["params"] += [p for p in group["params"] if p not in same["params"]]
        for fqn, slots in part["scalars"].items():
            scalars.setdefault(fqn, slots)
    return {"param_groups": merged, "scalars": scalars}


def _hyper(group: dict) -> str:
    return repr(sorted((k, v) for k, v in group.items() if k != "params"))
