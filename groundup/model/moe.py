"""Mixture of experts: a top-k router over SwiGLU (or other) experts, optional shared experts.

Load balancing, two ways (use either or both):
- Auxiliary-loss-free (DeepSeek-V3): a per-expert bias is added to the router scores for
  choosing experts only (never for weighting them). After each optimizer step the trainer calls
  `update_bias`, which nudges the bias of under-loaded experts up and over-loaded ones down by a
  fixed rate, so load drifts toward uniform without a gradient fighting the language-model loss.
- An auxiliary loss (Switch Transformer): n_experts * sum_i f_i * P_i, where f_i is the share of
  routed tokens expert i received and P_i its mean router probability.

Routing is dropless (no capacity factor), so every token's output depends on that token alone:
cached decoding equals a full forward.
"""

from __future__ import annotations

import torch
from torch import nn

from groundup.model.config import ModelConfig
from groundup.model.mlp import MLP, activation


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E, d, f = cfg.n_experts, cfg.d_model, cfg.expert_ffn_dim
        self.n_experts, self.top_k, self.kind = E, cfg.moe_top_k, cfg.mlp
        self.gated = cfg.gated
        self.score_func, self.norm_topk = cfg.moe_router, cfg.moe_norm_topk
        self.aux_loss_coef = cfg.moe_aux_loss_coef
        self.router = nn.Linear(d, E, bias=False)
        self.experts_in = nn.Parameter(torch.empty(E, (2 if self.gated else 1) * f, d))
        self.experts_out = nn.Parameter(torch.empty(E, d, f))
        self.experts_out.is_residual_proj = True
        self.shared = MLP(d, f * cfg.n_shared_experts, cfg.mlp) if cfg.n_shared_experts else None
        # Selection bias (learned state, saved with the weights) and routed-token counts since the
        # last bias update (statistics, not saved).
        self.register_buffer("expert_bias", torch.zeros(E))
        self.register_buffer("load", torch.zeros(E), persistent=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expert indices (N, k), gate weights (N, k) and router probabilities (N, E)."""
        logits = self.router(x).float()
        scores = logits.softmax(dim=-1) if self.score_func == "softmax" else logits.sigmoid()
        chosen = torch.topk(scores + self.expert_bias, self.top_k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-20)
        probs = scores if self.score_func == "softmax" else scores / scores.sum(-1, keepdim=True)
        return chosen, weights, probs

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return moe_forward(self, x, lambda e, rows: rows @ self.experts_in[e].t(),
                           lambda e, rows: rows @ self.experts_out[e].t())

    @torch.no_grad()
    def update_bias(self, rate: float, load: torch.Tensor | None = None) -> torch.Tensor:
        """Move the selection bias toward uniform load; returns the load used, then resets it.

        Under data parallelism pass the load summed over ranks so every rank moves the same way.
        """
        load = self.load.clone() if load is None else load
        if rate and load.sum() > 0:
            self.expert_bias += rate * torch.sign(load.mean() - load)
        self.load.zero_()
        return load


def load_imbalance(load: torch.Tensor) -> float:
    """max/mean of per-expert token counts: 1.0 is perfectly balanced."""
    load = load.float()
    return float(load.max() / load.mean().clamp_min(1e-9))


def moe_forward(moe: MoE, x: torch.Tensor, mm_in, mm_out) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE layer's computation with the expert matmuls as callables `mm(e, rows) -> rows @ W_e^T`
    (float weights here; quantized ones in quant/modules.py): route, group the (token, slot) pairs by
    expert, run each expert on its rows, weight and scatter back, add the shared experts."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    chosen, weights, probs = moe.route(x)
    flat = chosen.reshape(-1)
    counts = torch.bincount(flat, minlength=moe.n_experts)
    order = torch.argsort(flat, stable=True)
    token_of = order // moe.top_k
    xs = x[token_of]
    out = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n == 0:
            continue
        h = mm_in(e, xs[start : start + n])
        if moe.gated:
            gate, up = h.chunk(2, dim=-1)
            h = activation(moe.kind, gate) * up
        else:
            h = activation(moe.kind, h)
        out[start : start + n] = mm_out(e, h)
        start += n
    y, aux = combine(moe, x, out, weights, order, token_of, counts, probs)
    return y.reshape(shape), aux


def combine(moe: MoE, x: torch.Tensor, out: torch.Tensor, weights, order, token_of, counts, probs):
    """The experts' rows `out` (in `order`) weighted by the router and summed back onto their tokens, plus the
    shared experts; and the load-balancing loss (Switch's, counted per expert in `moe.load` while training).
    Shared by the one-process layer and the expert-parallel one (train/expert_parallel.py)."""
    gate_w = weights.reshape(-1)[order].to(out.dtype).unsqueeze(-1)
    y = torch.zeros_like(x).index_add_(0, token_of, out * gate_w)
    if moe.shared is not None:
        y = y + moe.shared(x)
    aux = x.new_zeros((), dtype=torch.float32)
    if moe.training:
        with torch.no_grad():
            moe.load += counts.to(moe.load.dtype)
        if moe.aux_loss_coef:
            share = counts.float() / order.numel()
            aux = moe.aux_loss_coef * moe.n_experts * (share * probs.mean(dim=0)).sum()
    return y, aux
