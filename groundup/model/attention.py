"""Causal self-attention: MHA, GQA and MQA through one module (n_kv_heads picks which).

Scores go through `torch.nn.functional.scaled_dot_product_attention` (flash/memory-efficient
kernels on CUDA, a fused kernel on CPU). Attention-logit soft-capping (Gemma 2) needs the scores
themselves, so it takes the explicit path in `attend`; so does one decoded token, for which two
small matmuls beat SDPA's CPU kernels several times over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from groundup.model.config import ModelConfig
from groundup.model.norm import RMSNorm
from groundup.model.rope import apply_rope


@dataclass
class AttnMask:
    """How queries see keys: plain causal (fast path) or an explicit boolean mask (True = attend)."""

    causal: bool
    mask: torch.Tensor | None = None  # (B or 1, 1, Tq, Tk)


def build_mask(q_len: int, start: int, pad_lens: torch.Tensor | None, device: torch.device) -> AttnMask:
    """The attention mask for queries at positions start..start+q_len over keys 0..start+q_len.

    `pad_lens[b]` left-padding positions of row b are never attended to; a padding query attends to
    itself only, so its softmax stays finite.
    """
    total = start + q_len
    if pad_lens is None:
        if start == 0:
            return AttnMask(causal=True)
        if q_len == 1:
            return AttnMask(causal=False)  # one new token sees every cached key
    q_pos = torch.arange(start, total, device=device)
    k_pos = torch.arange(total, device=device)
    mask = k_pos[None, :] <= q_pos[:, None]  # (Tq, Tk)
    if pad_lens is None:
        return AttnMask(causal=False, mask=mask[None, None])
    valid = k_pos[None, :] >= pad_lens[:, None].to(device)  # (B, Tk)
    mask = (mask[None] & valid[:, None, :]) | (k_pos[None, None, :] == q_pos[None, :, None])
    return AttnMask(causal=False, mask=mask[:, None])


def last_query(mask: AttnMask, cos: torch.Tensor, sin: torch.Tensor) -> tuple[AttnMask, torch.Tensor, torch.Tensor]:
    """The mask and RoPE tables of the last query position alone (keys keep every position)."""
    if mask.mask is not None:
        return AttnMask(causal=False, mask=mask.mask[..., -1:, :]), cos[..., -1:, :], sin[..., -1:, :]
    return AttnMask(causal=False), cos[..., -1:, :], sin[..., -1:, :]  # the last query sees every key


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask, scale: float,
           softcap: float = 0.0, dropout: float = 0.0) -> torch.Tensor:
    """softmax(q k^T * scale) v for q (B, H, Tq, D) and k, v (B, Hkv, Tk, D) with Hkv dividing H."""
    n_rep = q.shape[1] // k.shape[1]
    if not softcap and q.shape[2] > 1:
        if n_rep > 1:
            # Repeating K/V is faster on CPU than SDPA's enable_gqa fallback, and equal in result.
            k = k.repeat_interleave(n_rep, dim=1)
            v = v.repeat_interleave(n_rep, dim=1)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask.mask, is_causal=mask.causal, dropout_p=dropout, scale=scale)
    return _attend_grouped(q, k, v, mask, scale, softcap, dropout)


def _attend_grouped(q, k, v, mask: AttnMask, scale: float, softcap: float, dropout: float) -> torch.Tensor:
    """The explicit path: soft-capping needs the scores, and one decoded token (Tq = 1) is several
    times faster as two small matmuls than through SDPA's CPU kernels.

    The query heads that share a KV head are stacked as rows of one matmul against that head's
    keys (B, Hkv, n_rep * Tq, Tk), so K and V (the whole cache while decoding, or MLA's shared
    latent for all heads) are never copied n_rep times.
    """
    B, H, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    n_rep = H // Hkv
    if Tq == 1 and torch.compiler.is_compiling():
        return _attend_one_compiled(q, k, v, mask, scale, softcap)
    scores = (q.reshape(B, Hkv, n_rep * Tq, -1) @ k.transpose(-2, -1)).float() * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if mask.causal or mask.mask is not None:
        if mask.causal:
            keep = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
        else:
            keep = mask.mask.unsqueeze(2)  # (B or 1, 1, 1, Tq, Tk): the same for every head of a group
        scores = scores.view(B, Hkv, n_rep, Tq, Tk).masked_fill(~keep, float("-inf")).view(B, Hkv, n_rep * Tq, Tk)
    probs = scores.softmax(dim=-1).to(q.dtype)
    if dropout:
        probs = F.dropout(probs, p=dropout)
    return (probs @ v).view(B, H, Tq, v.shape[-1])


def _attend_one_compiled(q, k, v, mask: AttnMask, scale: float, softcap: float) -> torch.Tensor:
    """One query per row as products and sums, which inductor fuses into passes over the cache.

    As matmuls, inductor's GEMM templates would repack the whole cache at every step (and SDPA's
    CPU kernel is slower still for a few query rows); normalising after the weighted sum keeps the
    exponentials out of the per-output-element loop.
    """
    B, H, _, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    q = q.reshape(B, Hkv, H // Hkv, 1, D)
    scores = (q * k.unsqueeze(2)).sum(-1, dtype=torch.float32) * scale  # (B, Hkv, n_rep, Tk)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if mask.mask is not None:
        scores = scores.masked_fill(~mask.mask.reshape(-1, 1, 1, Tk), float("-inf"))
    e = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    y = (e.to(q.dtype).unsqueeze(-1) * v.unsqueeze(2)).sum(-2) / e.sum(dim=-1, keepdim=True).to(q.dtype)
    return y.reshape(B, H, 1, v.shape[-1])


class Attention(nn.Module):
    """Grouped-query attention with RoPE and optional QK-norm; q, k and v come from one matmul."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.attn_head_dim
        self.softcap, self.dropout = cfg.attn_logit_softcap, cfg.dropout
        qkv_out = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(cfg.d_model, qkv_out, bias=cfg.bias or cfg.qkv_bias)  # qkv_bias: Qwen2
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.d_model, bias=cfg.bias)
        self.o_proj.is_residual_proj = True
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: AttnMask,
                cache=None, last_only: bool = False) -> torch.Tensor:
        """(B, T, d_model), or (B, 1, d_model) with `last_only`: keys and values of every position
        (and the cache) as usual, the output of the last query alone."""
        B, T, _ = x.shape
        H, K, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split([H * D, K * D, K * D], dim=-1)
        k = k.view(B, T, K, D).transpose(1, 2)
        v = v.view(B, T, K, D).transpose(1, 2)
        if self.k_norm is not None:
            k = self.k_norm(k)
        k = apply_rope(k, cos, sin)
        if last_only:
            q, T = q[:, -1:], 1
            mask, cos, sin = last_query(mask, cos, sin)
        q = q.reshape(B, T, H, D).transpose(1, 2)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rope(q, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v)
        dropout = self.dropout if self.training else 0.0
        y = attend(q, k, v, mask, D**-0.5, self.softcap, dropout)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * D))
