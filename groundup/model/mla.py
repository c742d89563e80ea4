"""Multi-head latent attention (DeepSeek-V2).

Keys and values are reconstructed from a low-rank latent c_kv (kv_lora_rank wide) that all heads
share, and a small decoupled RoPE key k_pe (qk_rope_head_dim wide), also shared. The KV cache
therefore stores only (kv_lora_rank + qk_rope_head_dim) numbers per token and layer, against
2 * n_kv_heads * head_dim for GQA.

Without a cache (training), keys and values are materialised per head. With a cache, the
up-projection is absorbed into the query and the output instead ("weight absorption"):

    q_nope . (W_uk c)  =  (W_uk^T q_nope) . c        attn @ (W_uv c)  =  W_uv (attn @ c)

so decoding attends directly over the cached latents and never rebuilds per-head keys.
"""

from __future__ import annotations

import torch
from torch import nn

from groundup.model.attention import AttnMask, attend, last_query
from groundup.model.config import ModelConfig
from groundup.model.norm import RMSNorm
from groundup.model.rope import apply_rope


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.nope, self.rope, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rank = cfg.kv_lora_rank
        self.softcap, self.dropout = cfg.attn_logit_softcap, cfg.dropout
        self.scale = (self.nope + self.rope) ** -0.5
        q_out = self.n_heads * (self.nope + self.rope)
        if cfg.q_lora_rank:
            self.q_down = nn.Linear(cfg.d_model, cfg.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.q_up = nn.Linear(cfg.q_lora_rank, q_out, bias=False)
        else:
            self.q_proj = nn.Linear(cfg.d_model, q_out, bias=False)
        self.kv_down = nn.Linear(cfg.d_model, self.rank + self.rope, bias=False)
        self.kv_norm = RMSNorm(self.rank, cfg.norm_eps)
        self.kv_up = nn.Linear(self.rank, self.n_heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.v_dim, cfg.d_model, bias=False)
        self.o_proj.is_residual_proj = True

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_up(self.q_norm(self.q_down(x)))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: AttnMask,
                cache=None, last_only: bool = False) -> torch.Tensor:
        """(B, T, d_model), or (B, 1, d_model) with `last_only` (the last query alone)."""
        B, T, _ = x.shape
        H = self.n_heads
        c_kv, k_pe = self.kv_down(x).split([self.rank, self.rope], dim=-1)
        c_kv = self.kv_norm(c_kv)
        k_pe = apply_rope(k_pe.unsqueeze(1), cos, sin)  # (B, 1, T, rope): one RoPE key for all heads
        Tk = T
        if last_only:
            x, T = x[:, -1:], 1
            mask, cos, sin = last_query(mask, cos, sin)
        q = self._queries(x).view(B, T, H, self.nope + self.rope).transpose(1, 2)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        q_pe = apply_rope(q_pe, cos, sin)
        dropout = self.dropout if self.training else 0.0
        if cache is None:
            kv = self.kv_up(c_kv).view(B, Tk, H, self.nope + self.v_dim).transpose(1, 2)
            k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
            k = torch.cat([k_nope, k_pe.expand(B, H, Tk, self.rope)], dim=-1)
            y = attend(torch.cat([q_nope, q_pe], dim=-1), k, v, mask, self.scale, self.softcap, dropout)
        else:
            c_all, pe_all = cache.update(c_kv, k_pe.squeeze(1))  # (B, L, rank), (B, L, rope)
            w = self.kv_up.weight.view(H, self.nope + self.v_dim, self.rank)
            w_uk, w_uv = w[:, : self.nope], w[:, self.nope :]
            q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)
            keys = torch.cat([c_all, pe_all], dim=-1).unsqueeze(1)  # (B, 1, L, rank + rope)
            y_latent = attend(torch.cat([q_latent, q_pe], dim=-1), keys, c_all.unsqueeze(1), mask,
                              self.scale, self.softcap, dropout)
            y = torch.einsum("bhtr,hvr->bhtv", y_latent, w_uv)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * self.v_dim))
