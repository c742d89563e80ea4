"""Rotary position embeddings (RoPE), in the rotate-half layout Llama and Hugging Face use.

The cos/sin tables cover `max_seq_len` positions. Scaling for contexts longer than trained on:
"linear" divides positions by the factor (position interpolation); "ntk" raises the base
(theta * factor^(d/(d-2))), which keeps high frequencies intact.
"""

from __future__ import annotations

import torch


def rope_tables(head_dim: int, max_len: int, theta: float, scaling: str = "none", factor: float = 1.0,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_len, head_dim), in float32."""
    if scaling == "ntk":
        theta = theta * factor ** (head_dim / (head_dim - 2))
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)
    if scaling == "linear":
        inv_freq = inv_freq / factor
    positions = torch.arange(max_len, device=device, dtype=torch.float64)
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """x * cos + rotate_half(x) * sign * sin, written half by half into one output (no cat, no neg).

    Uses the first half of cos/sin only: rope_tables repeats the frequencies in both halves.
    """
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty_like(x)
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, c, out=o1).addcmul_(x2, s, value=-sign)
    torch.mul(x2, c, out=o2).addcmul_(x1, s, value=sign)
    return out


class _RopeFunction(torch.autograd.Function):
    """RoPE is a rotation, so its backward is the rotation by -angle: two fused passes instead of
    autograd's walk back through cat, neg, slices and broadcasts (the tables need no gradient)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, 1.0)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, sin, -1.0), None, None


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    """True when `shape` broadcasts to `target` without growing it (torch.broadcast_shapes costs ~70 µs a
    call, 7% of a small model's decode step)."""
    return len(shape) <= len(target) and all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by cos/sin of shape (T, D) or (B, 1, T, D)."""
    # Under torch.compile the plain formula below is what inductor fuses; dynamo cannot trace
    # `out=` into slices (it would break the graph at every layer).
    if (x.dtype == cos.dtype == sin.dtype and not (cos.requires_grad or sin.requires_grad)
            and _broadcasts_to(cos.shape, x.shape) and _broadcasts_to(sin.shape, x.shape)
            and not torch.compiler.is_compiling()):
        return _RopeFunction.apply(x, cos, sin) if x.requires_grad else _rotate(x, cos, sin, 1.0)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)
