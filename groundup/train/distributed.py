"""Data parallelism with torch's own engine: DDP or FSDP2 (`fully_shard`) under torchrun.

    torchrun --nproc-per-node 8 -m groundup train --config run.toml --out RUN distributed.strategy=fsdp

One process (no torchrun, or WORLD_SIZE=1) trains a plain module. More than one: a process group
(NCCL on GPUs, gloo on CPUs) and either DistributedDataParallel or FSDP2 with each transformer
block and then the whole model sharded over a 1-D device mesh (an explicit CPU mesh when there
is no GPU). Checkpoints hold *full* state dicts keyed by parameter name, gathered with
`torch.distributed.checkpoint.state_dict`, so a checkpoint written by any layout loads into any
other, a single process included.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from groundup.errors import ConfigError
from groundup.train.config import TrainConfig


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    strategy: str = "single"  # single, ddp or fsdp
    mesh: object = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of a list of numbers over all processes (float64, so exact for counts)."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.active:
            t = t.to(self.device) if self.device.type == "cuda" else t
            dist.all_reduce(t)
        return t.cpu().tolist()

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        if self.active:
            dist.all_reduce(t)
        return t

    def gather(self, obj) -> list:
        """Every process's `obj`, on every process."""
        if not self.active:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

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
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


def pick_device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"train.device = {name!r}: expected auto, cpu, cuda or cuda:N", key="train.device") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"train.device = {name!r}: training runs on cpu or cuda (auto picks)", key="train.device")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device = {name!r}, but torch sees no CUDA device", key="train.device")
        if device.index is None:
            device = torch.device(f"cuda:{local_rank}")
    return device


def init_distributed(cfg: TrainConfig) -> Dist:
    """Join the torchrun process group when there is one; otherwise a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(cfg.train.device, local)
    if world == 1:
        return Dist(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = cfg.distributed.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    mesh = None
    if cfg.distributed.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
    return Dist(rank, world, local, device, cfg.distributed.strategy, mesh)


def wrap(model: nn.Module, d: Dist, mp_policy=None, find_unused: bool = False) -> nn.Module:
    """The module the training step calls: the model itself, DDP around it, or FSDP2-sharded in place."""
    if d.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # MoE experts that receive no token in a batch have no gradient: DDP must expect that.
        return DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None,
                                       find_unused_parameters=find_unused)
    if d.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        kwargs = {"mesh": d.mesh, **({"mp_policy": mp_policy} if mp_policy is not None else {})}
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


def total_norm(grads: list[torch.Tensor]) -> float:
    """The global L2 norm of the gradients (FSDP shards included)."""
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP: reduce the shards' partial norms
        norm = norm.full_tensor()
    return float(norm)


# ----------------------------------------------------------------------------- full state dicts


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: nn.Module, d: Dist) -> dict[str, torch.Tensor]:
    """The whole model's state on the main process (on CPU); empty elsewhere. Collective under FSDP."""
    if d.strategy != "fsdp":
        return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()} if d.is_main else {}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(cpu_offload=True))


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor], d: Dist) -> None:
    """Load a full state (every process holds it) into a plain, DDP or FSDP2 model."""
    if d.strategy != "fsdp":
        unwrap(model).load_state_dict(state, strict=True)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, state, options=_options())


def full_optimizer_state(model: nn.Module, optimizers: list, d: Dist) -> dict:
    """Optimizer state keyed by parameter name, on the main process. Collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if d.strategy != "fsdp" and not d.is_main:
        return {}
    return get_optimizer_state_dict(unwrap(model), optimizers, options=_options(cpu_offload=True))


def load_optimizer_state(model: nn.Module, optimizers: list, state: dict, d: Dist) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(unwrap(model), optimizers, state, options=_options())
