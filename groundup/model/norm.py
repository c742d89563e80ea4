"""RMSNorm and LayerNorm behind one constructor."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps))


class _RMSNormFunction(torch.autograd.Function):
    """fp32 RMSNorm with a hand-written backward.

    On CPU, F.rms_norm is a composite of pow, mean, rsqrt and two multiplies, and autograd walks
    each one back with its own temporaries; this does the same math in about half the passes over
    the activations (3-4x faster for a training step's norms). CUDA keeps torch's fused kernel.
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = _rstd(x, eps)
        ctx.save_for_backward(x, weight, rstd)
        return torch.mul(x, rstd).mul_(weight)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        x_hat = x * rstd
        grad_weight = (grad * x_hat).sum(dim=tuple(range(x.dim() - 1)))
        grad_x_hat = grad * weight
        dot = (grad_x_hat * x_hat).mean(-1, keepdim=True)
        return grad_x_hat.sub_(x_hat.mul_(dot)).mul_(rstd), grad_weight, None


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == self.weight.dtype == torch.float32:
            if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
                return _RMSNormFunction.apply(x, self.weight, self.eps)
            # No graph to build (decoding, evaluation): the same arithmetic without autograd.Function's
            # per-call cost (about 30 µs, a tenth of a small model's decode step).
            return torch.mul(x, _rstd(x, self.eps)).mul_(self.weight)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def make_norm(kind: str, dim: int, eps: float, bias: bool = False) -> nn.Module:
    if kind == "rmsnorm":
        return RMSNorm(dim, eps)
    return nn.LayerNorm(dim, eps=eps, bias=bias)
