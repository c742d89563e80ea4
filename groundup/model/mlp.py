"""Feed-forward layers: SwiGLU (default), GeGLU, GELU and squared ReLU.

Gated variants compute gate and up projections in one matmul (`gate_up_proj`, gate first), which
is faster than two on both CPU and GPU; export splits it back into Llama's gate_proj/up_proj.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def activation(kind: str, x: torch.Tensor) -> torch.Tensor:
    if kind == "swiglu":
        return F.silu(x)
    if kind in ("geglu", "gelu"):
        return F.gelu(x, approximate="tanh")  # GPT-2 and Gemma use the tanh approximation
    if kind == "relu2":
        return F.relu(x).square()  # Primer (So et al., 2021)
    raise ValueError(f"unknown activation {kind!r}")


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, kind: str, bias: bool = False):
        super().__init__()
        self.kind = kind
        self.gated = kind in ("swiglu", "geglu")
        if self.gated:
            self.gate_up_proj = nn.Linear(d_model, 2 * d_ff, bias=bias)
        else:
            self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.down_proj.is_residual_proj = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(activation(self.kind, gate) * up)
        return self.down_proj(activation(self.kind, self.up_proj(x)))
