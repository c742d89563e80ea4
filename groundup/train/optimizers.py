"""Optimizers: AdamW, Muon (2-D hidden matrices) with AdamW for the rest, and Lion.

`build_optimizers` returns a list, because Muon is two optimizers: torch's `torch.optim.Muon`
(torch >= 2.9; a Newton-Schulz fallback is below for older torch) for the hidden weight matrices,
and AdamW for embeddings, the output layer, norms, biases and 3-D expert stacks. The loop treats
the list as one optimizer; `torch.distributed.checkpoint.state_dict` saves a list as one
parameter-name-keyed state, so checkpoints do not depend on how the model was wrapped.

Weight decay is decoupled and applies to matrices only: norms and biases never decay (they set
scales and offsets; pulling them to 0 fights the model), and embeddings decay only when asked
(a rarely seen token's row would decay toward 0 between its updates).
"""

from __future__ import annotations

import torch
from torch import nn

from groundup.errors import ConfigError
from groundup.train.config import OptimConfig
from groundup.train.precision import Bf16ViaFp32, cpu_has_native_bf16


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al., 2023): the sign of an interpolated momentum, with decoupled weight decay.

    update = sign(beta1 * m + (1 - beta1) * g);  p -= lr * (update + wd * p);  m = beta2 * m + (1 - beta2) * g
    """

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                update = m.lerp(p.grad, 1 - beta1).sign_()
                p.mul_(1 - group["lr"] * group["weight_decay"]).add_(update, alpha=-group["lr"])
                m.lerp_(p.grad, 1 - beta2)
        return loss


def zeropower_newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """An approximately orthogonal matrix with g's singular vectors (Muon's quintic iteration)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.float() / (g.norm() + eps)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.t()
    for _ in range(steps):
        s = x @ x.t()
        x = a * x + (b * s + c * s @ s) @ x
    return (x.t() if tall else x).to(g.dtype)


class NewtonSchulzMuon(torch.optim.Optimizer):
    """Muon for torch builds without `torch.optim.Muon`: Nesterov momentum, then orthogonalised,
    scaled to AdamW's update RMS (0.2 * sqrt(max(rows, cols))) so one learning rate serves both."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 ns_steps: int = 5):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, ns_steps=ns_steps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buf, group["momentum"])  # Nesterov
                update = zeropower_newton_schulz(update, group["ns_steps"])
                scale = 0.2 * max(p.shape) ** 0.5
                p.mul_(1 - group["lr"] * group["weight_decay"]).add_(update, alpha=-group["lr"] * scale)
        return loss


if hasattr(torch.optim, "Muon"):

    class _TorchMuon(torch.optim.Muon):
        """torch.optim.Muon, whose Newton-Schulz iteration runs in bf16: on a CPU without bf16 matmul
        instructions those matmuls run as fp32 arithmetic on the bf16 values (same numbers, ~30x faster)."""

        def step(self, closure=None):
            on_cpu = all(p.device.type == "cpu" for g in self.param_groups for p in g["params"])
            if on_cpu and not cpu_has_native_bf16():
                with Bf16ViaFp32():
                    return super().step(closure)
            return super().step(closure)


def _is_dtensor(p: torch.Tensor) -> bool:
    return type(p).__name__ == "DTensor"


def param_groups(model: nn.Module, cfg: OptimConfig) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Named parameters sorted into 'muon' (2-D hidden matrices, when Muon is used), 'decay' and 'no_decay'."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = getattr(model, "lm_head", None)
    outputs = {id(head.weight)} if head is not None else set()
    groups: dict[str, list] = {"muon": [], "decay": [], "no_decay": []}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if cfg.name == "muon" and p.dim() == 2 and id(p) not in embeddings | outputs:
            groups["muon"].append((name, p))
        elif p.dim() < 2 or (id(p) in embeddings and not cfg.decay_embeddings):
            groups["no_decay"].append((name, p))
        else:
            groups["decay"].append((name, p))
    return groups


def _adamw(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    kind = cfg.implementation
    if kind == "auto":
        kind = "fused"  # CPU and CUDA both have fused AdamW kernels (torch >= 2.4), DTensors too
    kwargs = {"fused": True} if kind == "fused" else {"foreach": kind == "foreach"}
    return torch.optim.AdamW(groups, lr=0.0, betas=tuple(cfg.betas), eps=cfg.eps, **kwargs)


def build_optimizers(model: nn.Module, cfg: OptimConfig) -> list[torch.optim.Optimizer]:
    """The optimizers for `model`'s parameters; the schedule sets their rates before each step."""
    named = param_groups(model, cfg)
    sharded = any(_is_dtensor(p) for group in named.values() for _, p in group)
    # One group per device mesh (plain tensors: none): a fused or foreach kernel takes one kind only, and
    # expert parallelism's expert shards live on another mesh than FSDP's (or beside DDP's plain tensors).
    groups = [{"params": [p for _, p in named[k] if getattr(p, "device_mesh", None) == mesh], "weight_decay": wd}
              for k, wd in (("decay", cfg.weight_decay), ("no_decay", 0.0))
              for mesh in dict.fromkeys(getattr(p, "device_mesh", None) for _, p in named[k])]
    if cfg.name == "lion":
        return [Lion(groups, lr=0.0, betas=cfg.lion_betas)]
    optimizers = [_adamw(groups, cfg)]
    if cfg.name == "muon" and named["muon"]:
        if sharded:
            raise ConfigError("optim.name = 'muon' with distributed.strategy = 'fsdp': Newton-Schulz needs whole "
                              "matrices, FSDP shards them; use strategy 'ddp' or optim.name 'adamw'",
                              key="optim.name")
        params = [p for _, p in named["muon"]]
        if hasattr(torch.optim, "Muon"):
            # match_rms_adamw scales each update to AdamW's RMS, so one schedule drives both.
            muon = _TorchMuon(params, lr=0.0, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
                              ns_steps=cfg.muon_ns_steps, adjust_lr_fn="match_rms_adamw")
        else:
            muon = NewtonSchulzMuon(params, lr=0.0, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
                                    ns_steps=cfg.muon_ns_steps)
        optimizers.insert(0, muon)
    return optimizers
