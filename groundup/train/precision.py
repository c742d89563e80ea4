"""Numeric precision of a training step: fp32, bf16 autocast, or bf16 compute weights.

- fp32: everything in float32.
- bf16-autocast: float32 weights; matmuls run in bf16 under `torch.autocast`, which casts each
  weight to bf16 again at every use (forward and backward).
- bf16-weights: the model that runs forward/backward ("compute") holds bf16 weights, so there are
  no per-use casts; an fp32 copy ("master") holds the true weights for the optimizer and the
  checkpoint. After backward the bf16 gradients become the master's fp32 gradients; after the
  optimizer step the master is rounded into the compute weights. Buffers (RoPE tables, MoE
  statistics) stay fp32. Under FSDP the same thing is FSDP's own MixedPrecisionPolicy.

CPUs without native bf16 matmul (AVX2 only: no AVX-512-BF16, no AMX) run torch's bf16 kernels
about 30-100x slower than fp32. `cpu_bf16_matmul = "fp32"` (the default there) computes each
bf16 matmul and attention as float32 arithmetic on the bf16 values and rounds the result to bf16:
the product of two bf16 numbers is exact in fp32, so this is what bf16 hardware computes (fp32
accumulation, one rounding), with fp32 kernels' speed. Gradients flow through the same casts.
"""

from __future__ import annotations

import contextlib
import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from groundup.train.config import PrecisionConfig

_MATMULS = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
            torch.bmm, torch.Tensor.bmm, torch.addmm, torch.baddbmm, F.scaled_dot_product_attention}


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True when this CPU has bf16 matmul instructions (AVX-512-BF16 or AMX)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX512_BF16", "AMX", "AMX_BF16"):
        return True
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


class Bf16ViaFp32(TorchFunctionMode):
    """Runs bf16 matmuls and attention in fp32 on the bf16 values, rounding results to bf16.

    Under autocast, fp32 operands of a matmul are first rounded to bf16, as autocast would.
    """

    def __init__(self, autocast: bool = False):
        super().__init__()
        self.autocast = autocast

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _MATMULS:
            return func(*args, **kwargs)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        is_bf16 = any(t.dtype == torch.bfloat16 for t in tensors)
        if not (is_bf16 or self.autocast) or any(t.device.type != "cpu" for t in tensors):
            return func(*args, **kwargs)

        def up(a):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                return a.to(torch.bfloat16).float() if a.dtype != torch.bfloat16 else a.float()
            return a

        with torch.autocast("cpu", enabled=False):
            out = func(*(up(a) for a in args), **{k: up(v) for k, v in kwargs.items()})
        return out.to(torch.bfloat16)


class Precision:
    """Owns the master/compute split and the context a forward pass runs in."""

    def __init__(self, cfg: PrecisionConfig, device: torch.device, fsdp: bool = False):
        mode = cfg.mode
        if mode == "auto":
            bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
            mode = "bf16-autocast" if bf16_ok else "fp32"
        self.mode, self.device, self.fsdp = mode, device, fsdp
        self.bf16 = mode != "fp32"
        emulate = cfg.cpu_bf16_matmul
        if emulate == "auto":
            emulate = "fp32" if device.type == "cpu" and not cpu_has_native_bf16() else "native"
        self.emulate = self.bf16 and device.type == "cpu" and emulate == "fp32"
        # Separate bf16 compute weights only outside FSDP: FSDP's MixedPrecisionPolicy does it.
        self.split = mode == "bf16-weights" and not fsdp
        self.master: nn.Module | None = None
        self.compute: nn.Module | None = None
        self._pairs: list[tuple[nn.Parameter, nn.Parameter]] = []

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float32

    def fsdp_policy(self):
        """The MixedPrecisionPolicy for fully_shard, or None for fp32."""
        if not self.bf16 or self.mode == "bf16-autocast":
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def setup(self, model: nn.Module) -> nn.Module:
        """Given the fp32 model, return the module forward/backward runs on."""
        self.master = model
        if not self.split:
            self.compute = model
            return model
        compute = copy.deepcopy(model)
        for p in compute.parameters():
            p.data = p.data.to(torch.bfloat16)  # parameters only: buffers stay fp32
        self.compute = compute
        self._pairs = list(zip(model.parameters(), compute.parameters()))
        return compute

    def context(self):
        """What a forward pass runs under."""
        stack = contextlib.ExitStack()
        if self.mode == "bf16-autocast":
            stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
        if self.emulate:
            stack.enter_context(Bf16ViaFp32(autocast=self.mode == "bf16-autocast"))
        return stack

    @torch.no_grad()
    def grads_to_master(self) -> None:
        """Move the compute model's (bf16) gradients into the master's fp32 gradients, accumulating."""
        for master, compute in self._pairs:
            if compute.grad is None:
                continue
            if master.grad is None:
                master.grad = compute.grad.float()
            else:
                master.grad.add_(compute.grad)
            compute.grad = None

    @torch.no_grad()
    def master_to_compute(self) -> None:
        """Round the master weights into the compute weights (after the optimizer step or a load)."""
        for master, compute in self._pairs:
            compute.copy_(master)
        if self.split:
            for m_buf, c_buf in zip(self.master.buffers(), self.compute.buffers()):
                c_buf.copy_(m_buf)

    def zero_grad(self) -> None:
        for module in {id(m): m for m in (self.master, self.compute) if m is not None}.values():
            module.zero_grad(set_to_none=True)
