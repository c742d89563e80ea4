"""The training state: every field a run carries between steps, declared, and how it meets a checkpoint.

    state = build_state(cfg, dist, objective, loader, tokenizer=tok, run_dir=out)   # model from cfg.model
    state = build_state(cfg, dist, objective, loader, model=base_model, lora=...)  # or a model given (fine-tuning)
    result = train_step(state)                                                     # step.py
    save_state(state, log); restore_state(state, load_checkpoint(path), note)

FSDP2 and tensor-parallel runs save and restore their model and optimizer state as shards (dcp.py);
one process and DDP runs as full state dicts (checkpoint.py). Either kind resumes under any layout.

Exact resume rests on one rule: everything that decides a later step lives in these fields, and
`save_state` writes all of it (weights, optimizer, schedule, loader position, spike-guard history,
counters, the RNG state of every process); nothing else carries state between steps.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from groundup.interop.peft_format import read_adapter_state, save_adapter
from groundup.model.lora import load_adapter_state
from groundup.model.config import ModelConfig
from groundup.model.sizing import check_fits
from groundup.model.transformer import Transformer
from groundup.train import checkpoint as ckpt
from groundup.train import dcp
from groundup.train.distributed import (Dist, full_model_state, full_optimizer_state, load_model_state,
                                        load_optimizer_state, wrap)
from groundup.train.objective import Objective
from groundup.train.optimizers import build_optimizers
from groundup.train.pipeline import pipeline_model
from groundup.train.precision import Precision
from groundup.train.schedules import Schedule
from groundup.train.stability import SpikeGuard


@dataclass
class TrainState:
    cfg: Any  # the run's config: a TrainConfig or a post-training config (both hold the core's sections)
    model_cfg: ModelConfig  # the trained model's config: cfg.model (pretraining) or the base model's
    seq_len: int  # tokens per row, for FLOPs per token (a sampled row's longest, GRPO)
    dist: Dist  # which process this is, the device, DDP or FSDP2
    precision: Precision  # the fp32 master / compute split and the forward context
    model: nn.Module  # what forward and backward run on (wrapped by DDP, or sharded by FSDP2)
    step_model: nn.Module  # `model`, or its torch.compile
    optimizers: list[torch.optim.Optimizer]
    schedule: Schedule
    guard: SpikeGuard
    loader: Any  # yields batches; has state_dict() / load_state_dict()
    objective: Objective
    tokenizer: Any = None  # the tokenizer the data was made with (its hash goes into checkpoints)
    run_dir: Path | None = None
    step: int = 0  # optimizer steps completed
    tokens: int = 0  # tokens consumed (all processes; rollbacks do not give them back)
    elapsed: float = 0.0  # seconds of training, over all sessions of this run
    gated: int = 0  # sequences dropped by the data gate
    lora: Any = None  # a LoraConfig when only adapters train: checkpoints then hold the adapter alone
    base: str | None = None  # the base model a fine-tuning run started from (recorded with adapters)
    master_moe: list = field(default_factory=list)  # MoE layers of the master model (their biases update)
    compute_moe: list = field(default_factory=list)  # ... and of the compute model (their load counts)

    @property
    def state_owner(self) -> nn.Module:
        """The module whose weights and optimizer state a checkpoint holds: the fp32 master (FSDP: the sharded model)."""
        return self.model if self.dist.strategy == "fsdp" else self.precision.master

    def note(self, text: str) -> None:
        if self.dist.is_main:
            print(text, flush=True)


def build_state(cfg, dist: Dist, objective: Objective, loader, *, tokenizer=None, run_dir: str | Path | None = None,
                model: nn.Module | None = None, lora=None, base: str | None = None) -> TrainState:
    """Model (from `cfg.model`, or `model` given in fp32), precision, wrapping, optimizers, schedule, guard.

    Every process builds the same initial weights (the seed is set first); dropout masks then differ
    between processes. Only parameters that require gradients get optimizer state. `lora`: the LoraConfig
    when only adapters train (checkpoints then hold the adapter alone, recording `base`).
    """
    d = dist
    fsdp = d.strategy == "fsdp"
    model_cfg = model.cfg if model is not None else cfg.model
    # fp32 weights, gradients and two optimizer moments (+ bf16 compute weights and gradients).
    check_fits(model_cfg, d.device, 16 + (4 if cfg.precision.mode == "bf16-weights" else 0),
               "weights, gradients and optimizer state", shards=d.processes if fsdp else 1)
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every process
    meta = d.strategy == "fsdp" and cfg.distributed.meta_init and model is None
    if model is None:
        with torch.device("meta" if meta else d.device):
            model = Transformer(model_cfg)
    else:
        model = model.to(d.device)
    model.grad_checkpointing = cfg.train.grad_checkpointing
    if d.pp > 1:  # this process's pipeline stages, under the whole model's parameter names (pipeline.py)
        model = pipeline_model(model, d, cfg, objective)
    precision = Precision(cfg.precision, d.device, fsdp=d.strategy == "fsdp")
    compute = precision.setup(model)
    wrapped = wrap(compute, d, precision.fsdp_policy(), find_unused=model_cfg.n_experts > 0)
    if meta:  # shards exist now: allocate and initialise them in place
        model.to_empty(device=d.device)
        model.reset_buffers()
        if d.device.type == "cpu":
            # DTensor has no RNG tracker on CPU meshes: each process draws its shards from its own
            # generator, which must then differ between processes or the shards would repeat.
            torch.manual_seed(cfg.train.seed + 1 + d.rank)
        with torch.no_grad():
            model.init_weights()
    step_model = torch.compile(wrapped) if cfg.train.compile else wrapped
    state = TrainState(
        cfg=cfg, model_cfg=model_cfg, seq_len=getattr(cfg.train, "seq_len", 0) or model_cfg.max_seq_len, dist=d,
        precision=precision, model=wrapped, step_model=step_model, lora=lora, base=base,
        optimizers=build_optimizers(precision.master, cfg.optim), schedule=Schedule(cfg.schedule, cfg.train.max_steps),
        guard=SpikeGuard(cfg.stability), loader=loader, objective=objective, tokenizer=tokenizer,
        run_dir=Path(run_dir) if run_dir is not None else None,
        master_moe=precision.master.moe_layers(), compute_moe=compute.moe_layers())
    torch.manual_seed(cfg.train.seed + 1 + d.rank)  # dropout masks differ between processes
    return state


def weights_finite(state: TrainState) -> bool:
    """True when every trainable weight is finite on every process (FSDP: each checks its shards)."""
    bad = 0.0
    with torch.no_grad():
        for p in state.precision.master.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if p.requires_grad and not bool(torch.isfinite(local).all()):
                bad = 1.0
                break
    return state.dist.sum([bad])[0] == 0


def _rng_state(d: Dist) -> dict:
    rng = {"cpu": torch.get_rng_state()}
    if d.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(d.device)
    return rng


def save_state(state: TrainState, metrics_offset: int, note: Callable[[str], None] = print) -> Path | None:
    """Checkpoint the current step (every process takes part; the main one writes); returns its directory.

    Sharded runs write their shards through DCP; with `checkpoint.async_save` this returns once the
    shards are copied to CPU memory, and the directory appears (with `latest` naming it) when complete."""
    d, cfg = state.dist, state.cfg
    if not weights_finite(state):  # a checkpoint must never hold what a rollback could not use
        note(f"step {state.step}: weights are not finite; no checkpoint saved")
        return None
    owner = state.state_owner
    if d.sharded and state.lora is None:
        return _save_sharded(state, owner, metrics_offset)
    if state.lora is not None:  # the adapter alone, in peft's layout; the base never changes
        def model_state(directory: Path) -> None:
            save_adapter(state.precision.master, state.lora, directory, base=state.base)
    else:
        model_state = full_model_state(owner, d)
    optim_state = full_optimizer_state(owner, state.optimizers, d)
    rngs, loaders = d.gather(_rng_state(d)), d.gather(state.loader.state_dict())
    path = None
    if d.is_main:
        trainer_state, meta = _trainer_and_meta(state, rngs, metrics_offset)
        path = ckpt.save_checkpoint(state.run_dir, state.step, cfg, state.model_cfg, model_state, optim_state, loaders,
                                    trainer_state, meta)
        ckpt.rotate(state.run_dir, cfg.checkpoint.every, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every)
    d.barrier()
    return path


def _trainer_and_meta(state: TrainState, rngs: list, metrics_offset: int) -> tuple[dict, dict]:
    d = state.dist
    trainer_state = {"step": state.step, "tokens": state.tokens, "elapsed": state.elapsed, "gated": state.gated,
                     "schedule": state.schedule.state_dict(), "guard": state.guard.state_dict(), "rng": rngs}
    meta = {"tokens": state.tokens, "world_size": d.world_size, "metrics_offset": metrics_offset,
            "objective": state.objective.name,
            "tokenizer_hash": state.tokenizer.hash if state.tokenizer is not None else None}
    return trainer_state, meta


def _save_sharded(state: TrainState, owner: nn.Module, metrics_offset: int) -> Path:
    """Every process writes its shards (dcp.start_save); the main process then finishes the directory."""
    d, cfg, step, run_dir = state.dist, state.cfg, state.step, state.run_dir
    rngs, loaders = d.gather(_rng_state(d)), d.gather(state.loader.state_dict())
    # Copies taken now: with async_save, training goes on while the main process writes them.
    trainer_state, meta = copy.deepcopy(_trainer_and_meta(state, rngs, metrics_offset))
    loaders = copy.deepcopy(loaders)
    meta["sharded"] = dcp.describe(d, owner)
    splits = {k: (tuple(n), list(s)) for k, (n, s) in meta["sharded"]["split_projections"].items()}
    async_save = bool(getattr(getattr(cfg, "checkpoint", None), "async_save", False))

    def finish(tmp: Path, digests: dict, groups: dict) -> None:  # main process; a background thread if async
        model_state = dcp.consolidate(tmp, splits)
        ckpt.finish_sharded(tmp, step, cfg, state.model_cfg, model_state, groups, loaders, trainer_state, meta, digests)

    def rotate() -> None:  # on the training thread, once the write is complete
        ckpt.rotate(run_dir, cfg.checkpoint.every, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every)

    path = dcp.start_save(d, owner, state.optimizers, run_dir, step, async_save, finish, rotate)
    if not async_save:
        d.barrier()
    return path


def restore_state(state: TrainState, data: dict, note: Callable[[str], None] = print, *, loader: bool = True,
                  rng: bool = True) -> None:
    """Load a checkpoint's contents (`checkpoint.load_checkpoint`) into the state, on every process.

    `loader=False` keeps the data position and counters (a rollback continues past the bad data);
    `rng=False` keeps the current random state.
    """
    d = state.dist
    owner = state.state_owner
    if data.get("sharded"):
        dcp.restore(d, owner, state.optimizers, data["dir"], data["meta"], (load_model_state, load_optimizer_state))
    else:
        if data["model"] is not None:
            load_model_state(owner, data["model"], d)
        else:
            load_adapter_state(owner, read_adapter_state(owner, data["dir"]), str(data["dir"]))
        load_optimizer_state(owner, state.optimizers, data["optimizer"], d)
    state.precision.master_to_compute()
    saved = data["trainer"]
    state.schedule.load_state_dict(saved["schedule"])
    state.step = int(saved["step"])
    if loader:
        ckpt.restore_loader(state.loader, data["loader"], note)
        state.guard.load_state_dict(saved["guard"])
        state.tokens, state.elapsed, state.gated = int(saved["tokens"]), float(saved["elapsed"]), int(saved["gated"])
    if rng and len(saved["rng"]) == d.world_size:
        torch.set_rng_state(saved["rng"][d.rank]["cpu"])
        if d.device.type == "cuda" and "cuda" in saved["rng"][d.rank]:
            torch.cuda.set_rng_state(saved["rng"][d.rank]["cuda"], d.device)
