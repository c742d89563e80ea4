"""The two weight formats and round-to-nearest (RTN) quantization into them.

    int8   symmetric, one scale per output channel (row):  w ~= q * s,        q in -127..127,
           s = max|w_row| / 127.  Tensors: qweight int8 (..., N, K), scales float (..., N).
    int4   asymmetric, one scale and zero point per group of `group_size` consecutive input
           columns (32, 64 or 128):  w ~= (q - z) * s,   q and z in 0..15,
           s = (max - min) / 15 and z = round(-min / s) over the group, the range widened to
           include 0 so that 0.0 is exact (as GPTQ does).
           Tensors: qweight uint8 (..., N, K / 2), scales float (..., N, K / g), zeros uint8 (..., N, K / g).

Packing of int4 (two values per byte), "planar per group": byte j of group i of a row holds
column i*g + j in its low nibble and column i*g + g/2 + j in its high nibble. A kernel then
reads the two halves of a group as two contiguous runs (which vectorises, unlike nibbles of
neighbouring columns); the device kernels' own layouts (PyTorch's tinygemm formats) are derived
from it when a model is loaded, so a file is the same on every device.

The leading `...` is the expert dimension of stacked MoE weights (E, N, K).
Every element obeys |w - dequantize(quantize(w))| <= s / 2 (up to float rounding).
"""

from __future__ import annotations

import torch

FORMATS = ("int8", "int4")
GROUP_SIZES = (32, 64, 128)
INT8_MAX = 127
INT4_MAX = 15


# ----------------------------------------------------------------------------- int8


def int8_scales(w: torch.Tensor) -> torch.Tensor:
    """max|w| / 127 per row (1.0 for an all-zero row, whose values are all 0 anyway)."""
    amax = w.abs().amax(dim=-1).float()
    return torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))


def int8_round(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Integers (as float) of w (..., N, K) at per-row `scales` (..., N), clamped to -127..127."""
    return torch.clamp(torch.round(w.float() / scales.unsqueeze(-1)), -INT8_MAX, INT8_MAX)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(qweight int8, scales float32) of a (..., N, K) weight."""
    scales = int8_scales(w)
    return int8_round(w, scales).to(torch.int8), scales


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (qweight.to(dtype) * scales.to(dtype).unsqueeze(-1))


# ----------------------------------------------------------------------------- int4


def int4_params(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and integer zero point (as float) per row of `w` (..., g): the whole last dim is one group."""
    w = w.float()
    lo = w.amin(dim=-1).clamp(max=0)
    hi = w.amax(dim=-1).clamp(min=0)
    empty = (lo == 0) & (hi == 0)  # an all-zero group: any scale represents it; avoid dividing by 0
    lo = torch.where(empty, -torch.ones_like(lo), lo)
    hi = torch.where(empty, torch.ones_like(hi), hi)
    scales = (hi - lo) / INT4_MAX
    zeros = torch.clamp(torch.round(-lo / scales), 0, INT4_MAX)
    return scales, zeros


def int4_round(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """Integers 0..15 (as float) of w at broadcastable scales and zeros."""
    return torch.clamp(torch.round(w.float() / scales) + zeros, 0, INT4_MAX)


def quantize_int4_unpacked(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8 (..., N, K) in 0..15, scales float32 (..., N, G), zeros uint8 (..., N, G))."""
    *lead, N, K = w.shape
    groups = w.float().reshape(*lead, N, K // group_size, group_size)
    scales, zeros = int4_params(groups)
    q = int4_round(groups, scales.unsqueeze(-1), zeros.unsqueeze(-1))
    return q.reshape(*lead, N, K).to(torch.uint8), scales, zeros.to(torch.uint8)


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight uint8 packed (..., N, K/2), scales float32 (..., N, G), zeros uint8 (..., N, G))."""
    q, scales, zeros = quantize_int4_unpacked(w, group_size)
    return pack_int4(q, group_size), scales, zeros


def pack_int4(q: torch.Tensor, group_size: int) -> torch.Tensor:
    """(..., N, K) values 0..15 -> (..., N, K/2) uint8, planar per group (see the module docstring)."""
    *lead, N, K = q.shape
    halves = q.to(torch.uint8).reshape(*lead, N, K // group_size, 2, group_size // 2)
    return (halves[..., 0, :] | (halves[..., 1, :] << 4)).reshape(*lead, N, K // 2)


def unpack_int4(qweight: torch.Tensor, group_size: int) -> torch.Tensor:
    """(..., N, K/2) packed -> (..., N, K) uint8 values 0..15."""
    *lead, N, half = qweight.shape
    p = qweight.reshape(*lead, N, 2 * half // group_size, group_size // 2)
    return torch.stack([p & 15, p >> 4], dim=-2).reshape(*lead, N, 2 * half)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(q - z) * s (so 0.0 stays exact), each half of a group written straight into its place."""
    *lead, N, half = qweight.shape
    G, h = 2 * half // group_size, group_size // 2
    p = qweight.reshape(*lead, N, G, h)
    s, z = scales.to(dtype).unsqueeze(-1), zeros.to(dtype).unsqueeze(-1)
    out = torch.empty(*lead, N, G, 2, h, dtype=dtype, device=qweight.device)
    for i, nibble in enumerate((p & 15, p >> 4)):
        half_out = out[..., i, :]
        torch.sub(nibble.to(dtype), z, out=half_out)
        half_out.mul_(s)
    return out.reshape(*lead, N, 2 * half)
