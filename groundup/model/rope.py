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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by cos/sin of shape (T, D) or (B, 1, T, D)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)
