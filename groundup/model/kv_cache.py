"""A preallocated KV cache for one batch scored or decoded together (evaluation's shared prefixes).

Buffers for `max_len` positions are allocated once, so decoding never reallocates. Generation runs on
the engine's paged cache instead (infer/kv_blocks.py), where sequences come and go. Rows of a batch may be left-padded to a common prompt length:
`pad_lens[b]` leading positions of row b are masked out and RoPE positions start after them, so a
padded row decodes exactly as it would alone.

GQA layers store K and V (B, n_kv_heads, L, head_dim); MLA layers store the compressed latent
(B, L, kv_lora_rank) and the shared RoPE key (B, L, qk_rope_head_dim).
"""

from __future__ import annotations

import torch

from groundup.model.attention import AttnMask, build_mask
from groundup.model.config import ModelConfig


class LayerCache:
    """Two preallocated buffers filled left to right; `update` returns the filled prefix."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, seq_dim: int):
        self.a, self.b, self.seq_dim = a, b, seq_dim
        self.start = 0  # set by KVCache before each forward

    def update(self, a_new: torch.Tensor, b_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.start + a_new.shape[self.seq_dim]
        self.a.narrow(self.seq_dim, self.start, end - self.start).copy_(a_new)
        self.b.narrow(self.seq_dim, self.start, end - self.start).copy_(b_new)
        return self.a.narrow(self.seq_dim, 0, end), self.b.narrow(self.seq_dim, 0, end)


class KVCache:
    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                 pad_lens: torch.Tensor | None = None):
        self.max_len = max_len or cfg.max_seq_len
        self.batch_size = batch_size
        self.pos = 0
        self.device = device
        self.reset(pad_lens)
        B, L = batch_size, self.max_len
        self.layers: list[LayerCache] = []
        for _ in range(cfg.n_layers):
            if cfg.attention == "mla":
                a = torch.zeros(B, L, cfg.kv_lora_rank, device=device, dtype=dtype)
                b = torch.zeros(B, L, cfg.qk_rope_head_dim, device=device, dtype=dtype)
                self.layers.append(LayerCache(a, b, seq_dim=1))
            else:
                shape = (B, cfg.kv_heads, L, cfg.attn_head_dim)
                a = torch.zeros(shape, device=device, dtype=dtype)
                b = torch.zeros(shape, device=device, dtype=dtype)
                self.layers.append(LayerCache(a, b, seq_dim=2))

    def prepare(self, n_new: int) -> int:
        """Check room for n_new positions and point every layer at the current position."""
        if self.pos + n_new > self.max_len:
            raise ValueError(f"KV cache overflow: {self.pos} + {n_new} positions exceed max_len {self.max_len}")
        for layer in self.layers:
            layer.start = self.pos
        return self.pos

    def advance(self, n_new: int) -> None:
        self.pos += n_new

    def reset(self, pad_lens: torch.Tensor | None = None) -> None:
        self.pos = 0
        self.pad_lens = None if pad_lens is None else pad_lens.to(device=self.device, dtype=torch.long)
        # Which cached positions are real tokens, per row: a decode step's mask is a slice of it,
        # so padded batches build no mask per step.
        self.key_valid = None if pad_lens is None else (
            torch.arange(self.max_len, device=self.device)[None] >= self.pad_lens[:, None])[:, None, None]

    def attn_mask(self, q_len: int) -> AttnMask:
        """The mask for q_len queries at the current position (call after `prepare`)."""
        if self.key_valid is not None and q_len == 1:
            return AttnMask(causal=False, mask=self.key_valid[..., : self.pos + 1])
        return build_mask(q_len, self.pos, self.pad_lens, self.device or "cpu")

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.a, layer.b))
