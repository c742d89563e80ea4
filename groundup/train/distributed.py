"""Parallelism with torch's own engines under torchrun: DDP, FSDP2 (`fully_shard`), and FSDP2 x tensor parallel.

    torchrun --nproc-per-node 8 -m groundup train --config run.toml --out RUN distributed.strategy=fsdp
    torchrun --nproc-per-node 8 -m groundup train ... distributed.strategy=fsdp distributed.tp=2

One process (no torchrun, or WORLD_SIZE=1) trains a plain module; only FSDP2 under torchrun shards
over a one-process mesh (the sharded path, DCP checkpoints and asynchronous saves included, on one
GPU). More than one: a process group (NCCL on GPUs, gloo on CPUs) and either DistributedDataParallel
or FSDP2 with each transformer block and then the whole model sharded over a device mesh (an
explicit CPU mesh when there is no GPU). With `distributed.tp` > 1 the mesh is 2-D, (dp, tp):
consecutive ranks form a tensor-parallel group (parallelize.py shards each block over it) and FSDP2
shards over dp. `distributed.strategy = "hsdp"` and `distributed.pp` > 1 build a named mesh (mesh.py):
HSDP is FSDP2 over (replicate, shard), and pipeline stages (pipeline.py), each tensor-parallel over its
own tp when tp > 1, shard over their own dp.

`Dist.rank` and `Dist.world_size` are *data-parallel*: the share of each batch this process reads
and how many shares there are (processes / tp / pp). The tp (and pp) processes of a group read the
same batch, so `Dist.sum` and `Dist.gather` count each replica once. `is_main` is global rank 0.

Full state dicts (`full_model_state`, ...) are keyed by the plain model's parameter names (tensor
parallelism's split projections fused back), gathered with `torch.distributed.checkpoint.state_dict`,
so what one layout writes any other loads, a single process included.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from groundup.device import resolve_device
from groundup.errors import ConfigError
from groundup.train.dcp import wait_pending
from groundup.train.expert_parallel import check_ep, ep_meshes, expert_parallel
from groundup.train.mesh import build_mesh, coordinates, data_mesh, mesh_dims
from groundup.train.pipeline import check_pp, own_param_groups, own_state, shard_stages
from groundup.train.parallelize import (check_tp, fuse_param_groups, fuse_state, split_names, split_param_groups,
                                        split_state, tensor_parallel)

# Process groups outlive destroy_process_group, on purpose. A gloo group's C++ destructor joins its worker
# threads while the caller holds the GIL, and a worker still letting go of the last collective's tensors
# (all_gather_object's, behind a barrier) needs the GIL to do so: the two wait for each other forever. The
# 2-process DDP test hung that way about 1 run in 8 on a loaded 2-core machine, rank 1 stuck in
# ~ProcessGroupGloo when DistributedDataParallel's Reducer was freed. Kept here, no group is destroyed on
# the training thread: the CLI leaves a distributed process with os._exit (`exit_process`), and a library
# caller's interpreter lets go of them at exit, after a pause that gives the workers the GIL.
_RETIRED_GROUPS: list = []


def _release_retired_groups() -> None:
    time.sleep(0.1)
    _RETIRED_GROUPS.clear()


def exit_process(code: int | None) -> None:
    """Leave a process that ran a process group without destroying the groups (see _RETIRED_GROUPS)."""
    if _RETIRED_GROUPS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if code is None else int(code))


@dataclass
class Dist:
    rank: int = 0  # data-parallel rank: which share of every batch this process reads
    world_size: int = 1  # data-parallel replicas (processes / tp)
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    strategy: str = "single"  # single, ddp or fsdp
    mesh: object = None  # FSDP's device mesh: 1-D, or 2-D (dp, tp) with tensor parallelism
    tp: int = 1  # tensor-parallel degree
    global_rank: int = 0
    processes: int = 1
    sequence_parallel: bool = False
    ckpt_group: object = None  # a gloo group of every process for checkpoint I/O (see dcp.py)
    pending: list = field(default_factory=list)  # checkpoints still being written (async_save)
    joined: bool = False  # init_distributed joined torchrun's process group (close leaves it)
    ep: int = 1  # expert-parallel degree (expert_parallel.py): MoE experts split over ep consecutive processes
    ep_mesh: object = None  # the 1-D mesh of this process's ep group
    ep_replicas: object = None  # the process group of the processes holding the same experts
    replicas: int = 1  # HSDP: replica groups, each holding one sharded copy (mesh.py); 1 = plain FSDP
    pp: int = 1  # pipeline stages' processes (pipeline.py): each data-parallel replica spans pp processes
    pp_rank: int = 0  # this process's place in its pipeline
    pp_group: object = None  # the process group of this process's pipeline

    @property
    def is_main(self) -> bool:
        return self.global_rank == 0

    @property
    def active(self) -> bool:
        return self.processes > 1

    @property
    def dp_mesh(self):
        return data_mesh(self.mesh)

    @property
    def sharded(self) -> bool:
        """True when the model's state lives in shards (FSDP2, tensor parallel, expert parallel): checkpoints
        go through DCP."""
        return self.strategy == "fsdp" or self.ep > 1

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over data-parallel replicas (float64, so exact for counts).

        All processes take part; the tp (and pp) processes of a replica hold the same values (same batch),
        so the total is divided by tp x pp. A per-process flag (stop, non-finite weights) stays non-zero."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.active:
            t = t.to(self.device) if self.device.type == "cuda" else t
            dist.all_reduce(t)
            if self.tp * self.pp > 1:
                t /= self.tp * self.pp
        return t.cpu().tolist()

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        if self.active:
            dist.all_reduce(t)
        return t

    def gather(self, obj) -> list:
        """Every data-parallel replica's `obj` (its first stage's tp-rank-0 process's), on every process, by `rank`."""
        if not self.active:
            return [obj]
        out = [None] * self.processes
        dist.all_gather_object(out, obj)
        return out[: self.processes // self.pp : self.tp]

    def broadcast(self, obj):
        """The main process's `obj`, on every process."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def close(self) -> None:
        """Finish checkpoints still being written (a background write must not outlive the group), then leave."""

        wait_pending(self, raise_errors=False)
        if (self.active or self.joined) and dist.is_initialized():
            if not _RETIRED_GROUPS:
                atexit.register(_release_retired_groups)
            _RETIRED_GROUPS.extend(getattr(dist.distributed_c10d._world, "pg_map", None) or [dist.group.WORLD])
            dist.destroy_process_group()


def _launched() -> bool:
    """True under torchrun (or a launcher like it): the environment names the process group's rendezvous."""
    return all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))


def init_distributed(cfg, model_cfg=None) -> Dist:
    """Join the torchrun process group when there is one; otherwise a single process. `model_cfg`: checked
    against the tensor-parallel layout now, when known (wrapping checks the model itself again)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(cfg.train.device, local, key="train.device")
    dc = cfg.distributed
    if world == 1 and dc.tp > 1:
        raise ConfigError(f"distributed.tp = {dc.tp} needs {dc.tp} processes or a multiple (torchrun "
                          f"--nproc-per-node {dc.tp}); this is one process", key="distributed.tp")
    if world == 1 and dc.ep > 1:
        raise ConfigError(f"distributed.ep = {dc.ep} needs {dc.ep} processes or a multiple (torchrun "
                          f"--nproc-per-node {dc.ep}); this is one process", key="distributed.ep")
    if world == 1 and dc.pp > 1:
        raise ConfigError(f"distributed.pp = {dc.pp} needs {dc.pp} processes or a multiple (torchrun "
                          f"--nproc-per-node {dc.pp}); this is one process", key="distributed.pp")
    if world == 1 and not (dc.strategy in ("fsdp", "hsdp") and _launched()):
        return Dist(device=device)
    if world % dc.tp:
        raise ConfigError(f"distributed.tp = {dc.tp} must divide the number of processes ({world})",
                          key="distributed.tp")
    if model_cfg is not None:
        check_tp(model_cfg, dc.tp, getattr(cfg.train, "seq_len", None), dc.sequence_parallel)
    check_ep(model_cfg, dc.ep, world)
    check_pp(cfg, model_cfg)
    if dc.ep > 1 and dc.strategy == "ddp" and getattr(getattr(cfg, "precision", None), "mode", "") == "bf16-weights":
        raise ConfigError("distributed.ep > 1 with precision.mode = 'bf16-weights' under DDP: the bf16 copy would "
                          "hold whole experts; use bf16-autocast, or strategy 'fsdp'", key="distributed.ep")
    if dc.tp > 1 and dc.meta_init and device.type == "cpu":
        # On CPU meshes DTensor has no RNG tracker, so shards initialised in place could not both
        # differ across tp and agree across replicas.
        raise ConfigError("distributed.meta_init with distributed.tp > 1 needs GPUs; on CPU build the model "
                          "whole (meta_init = false)", key="distributed.meta_init")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = dc.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():  # a launcher that sets the group up itself (Ray Train) sets its timeout too
        # A collective still waiting after timeout_s fails (a dead or stuck peer): the attempt ends, the launcher restarts it
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=dc.timeout_s))
    mesh, ckpt_group, where = None, None, {}
    if dc.strategy == "hsdp" or dc.pp > 1:  # a named mesh: (pp,) (dp | replicate, shard) (, tp); see mesh.py
        dims = mesh_dims(dc, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        mesh, where = build_mesh(device.type, dims), coordinates(dims, rank)
        where["replicas"] = dict(dims).get("replicate", 1)
        ckpt_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(minutes=60))
    elif dc.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh

        if dc.tp > 1:  # tp innermost: a tp group is consecutive ranks, on one node when tp <= GPUs per node
            mesh = init_device_mesh(device.type, (world // dc.tp, dc.tp), mesh_dim_names=("dp", "tp"))
        else:
            mesh = init_device_mesh(device.type, (world,))
        # Checkpoint writes (DCP) exchange their plans on a group of their own: an async save's
        # background thread must never interleave collectives with training's on the same group.
        ckpt_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(minutes=60))
    ep_mesh, ep_replicas = ep_meshes(device.type, world, dc.ep) if dc.ep > 1 else (None, None)
    if dc.ep > 1 and ckpt_group is None:
        ckpt_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(minutes=60))
    # HSDP is FSDP2 over a 2-D mesh: the rest of the core treats it as "fsdp" (sharded, DCP checkpoints).
    per_replica = dc.tp * dc.pp
    return Dist((rank % (world // dc.pp)) // dc.tp, world // per_replica, local, device,
                "fsdp" if dc.strategy == "hsdp" else dc.strategy, mesh, tp=dc.tp, global_rank=rank,
                processes=world, sequence_parallel=dc.sequence_parallel, ckpt_group=ckpt_group, joined=True,
                ep=dc.ep, ep_mesh=ep_mesh, ep_replicas=ep_replicas, replicas=where.get("replicas", 1), pp=dc.pp,
                pp_rank=where.get("pp", 0), pp_group=mesh["pp"].get_group() if dc.pp > 1 else None)


def wrap(model: nn.Module, d: Dist, mp_policy=None, find_unused: bool = False) -> nn.Module:
    """The module the training step calls: the model itself, DDP around it, or sharded in place
    (tensor parallel over the tp mesh first, then FSDP2 over dp). With `d.ep` > 1 the MoE experts are first
    split over the ep group, and DDP and FSDP2 leave them alone (expert_parallel.py reduces their gradients)."""
    experts = expert_parallel(model, d.ep_mesh, d.ep_replicas, d.processes) if d.ep > 1 else []
    if d.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if experts:
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, experts)
        # MoE experts that receive no token in a batch have no gradient: DDP must expect that. Always expecting
        # it also keeps one bucket layout for the whole run: otherwise DDP rebuilds its buckets after the first
        # step of every process start, so a resumed (or restarted) run's first step would sum gradients in
        # another order than the uninterrupted run did (last-bit differences from 3 processes on; reducer.hpp's
        # should_rebuild_buckets). The price is one walk over the autograd graph per step.
        del find_unused
        return DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None,
                                       find_unused_parameters=True)
    if d.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        kwargs = {"mesh": d.dp_mesh, **({"mp_policy": mp_policy} if mp_policy is not None else {})}
        if d.pp > 1:  # this process's pipeline stages (pipeline.py): each tensor-parallel, then sharded over dp
            return shard_stages(model, d.mesh["tp"] if d.tp > 1 else None, d.sequence_parallel, **kwargs)
        if d.tp > 1:
            tensor_parallel(model, d.mesh["tp"], d.sequence_parallel)
        if experts:
            kwargs["ignored_params"] = {p for n, p in model.named_parameters() if n in experts}
        for block in model.blocks:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The Transformer inside a DDP wrapper (FSDP2 shards in place, so it is the model itself)."""
    return getattr(model, "module", model)


@contextlib.contextmanager
def grad_sync(model: nn.Module, d: Dist, sync: bool, fsdp_every: bool = True):
    """Skip DDP's gradient all-reduce on micro-batches before the last of an optimizer step; FSDP
    reduce-scatters every micro-batch unless told otherwise (`fsdp_every`: see DistributedConfig)."""
    if d.strategy == "ddp" and not sync:
        with model.no_sync():
            yield
        return
    if d.strategy == "fsdp":
        model.set_requires_gradient_sync(sync or fsdp_every)
    yield


def total_norm(grads: list[torch.Tensor], pp: int = 1) -> float:
    """The global L2 norm of the gradients, shards included.

    Sharded gradients are DTensors on different meshes and layouts (FSDP's dp mesh; the 2-D (dp, tp)
    mesh of tensor-parallel weights). Each process adds the squares of its local shards, each divided
    by how many processes hold that same shard, and one all-reduce sums them: the same number on
    every process, whatever the mix of layouts. With `pp` pipeline stages a stage's parameters live on
    its processes / pp only, and the all-reduce over every process adds the stages' squares up; a tied
    embedding's gradient, held by the first and the last stage (`pp_copies`), counts once."""
    if not grads:
        return 0.0
    if not any(hasattr(g, "device_mesh") for g in grads):  # whole gradients (one process, DDP)
        return float(torch.nn.utils.get_total_norm(grads, norm_type=2.0))
    world = dist.get_world_size() // pp
    squares = torch.zeros((), dtype=torch.float64, device=grads[0].device)
    for g in grads:
        # A tied embedding's gradient under pipelining is held by the first and the last stage (pipeline.py)
        copies = getattr(g, "pp_copies", 1)
        local, holders = g, world * copies
        if hasattr(g, "device_mesh"):
            if any(p.is_partial() for p in g.placements):  # not yet summed over a mesh dimension: sum it
                from torch.distributed.tensor import Replicate

                g = g.redistribute(placements=[Replicate() if p.is_partial() else p for p in g.placements])
            local = g.to_local()
            shards = 1
            for size, placement in zip(g.device_mesh.shape, g.placements):
                # _StridedShard (FSDP over tensor-parallel shards) is a shard too, though not is_shard()
                shards *= size if placement.is_shard() or hasattr(placement, "split_factor") else 1
            holders = world // shards * copies
        squares += torch.linalg.vector_norm(local, dtype=torch.float32).double().square() / holders
    dist.all_reduce(squares)
    return float(squares) ** 0.5


# ----------------------------------------------------------------------------- full state dicts


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: nn.Module, d: Dist) -> dict[str, torch.Tensor]:
    """The whole model's state on the main process (on CPU); empty elsewhere. Collective under FSDP."""
    if not d.sharded:
        return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()} if d.is_main else {}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(cpu_offload=True))
    return fuse_state(state, split_names(model))


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor], d: Dist) -> None:
    """Load a full state (every process holds it) into a plain, DDP, FSDP2 or tensor-parallel model."""
    if not d.sharded:
        unwrap(model).load_state_dict(state, strict=True)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    if d.pp > 1:  # the whole model's state: this process's stages take their own part
        state = own_state(model, state)
    set_model_state_dict(model, split_state(state, split_names(model)), options=_options())


def full_optimizer_state(model: nn.Module, optimizers: list, d: Dist) -> dict:
    """Optimizer state keyed by parameter name, on the main process. Collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if not d.sharded and not d.is_main:
        return {}
    state = get_optimizer_state_dict(unwrap(model), optimizers, options=_options(cpu_offload=True))
    splits = split_names(unwrap(model))
    if not splits or not state:
        return state
    return {"state": fuse_state(state["state"], splits),
            "param_groups": fuse_param_groups(state["param_groups"], splits)}


def load_optimizer_state(model: nn.Module, optimizers: list, state: dict, d: Dist) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    splits = split_names(unwrap(model))
    if d.pp > 1:
        state = {"state": own_state(model, state["state"]),
                 "param_groups": own_param_groups(model, state["param_groups"])}
    if splits:
        state = {"state": split_state(state["state"], splits),
                 "param_groups": split_param_groups(state["param_groups"], splits)}
    set_optimizer_state_dict(unwrap(model), optimizers, state, options=_options())
