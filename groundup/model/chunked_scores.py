"""The output layer a chunk of positions at a time: log p(target) and token statistics, never the full logits.

The projection to the vocabulary and the log-softmax are computed `chunk` rows at a time, so memory is
(chunk x vocabulary), as for the fused loss (loss.py); the backward pass recomputes each chunk's logits
instead of storing them. Final-logit soft-capping is applied exactly as the model's own `logits` does.
The heads of heads.py call these; logprobs.py is the scorer every consumer uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from groundup.model.loss import IGNORE_INDEX


@dataclass
class TokenStats:
    logprobs: torch.Tensor  # (B, T) log p(target); 0 at ignored positions
    entropy: torch.Tensor  # (B, T) entropy of the predicted distribution (nats)
    greedy: torch.Tensor  # (B, T) bool: the target is the most likely token
    logp_mean: torch.Tensor  # (B, T) E_p[log p], = -entropy (Min-K%++ centres by it)
    logp_std: torch.Tensor  # (B, T) std_p[log p] (Min-K%++ scales by it)
    top_ids: torch.Tensor | None = None  # (B, T, k) the k most likely tokens
    top_logprobs: torch.Tensor | None = None  # (B, T, k) their log-probabilities


def _capped_logits(hc: torch.Tensor, w: torch.Tensor, softcap: float, temperature: float = 1.0):
    """(logits, tanh of the cap or None): softcap(h @ W^T), divided by `temperature` (TRL's tempered
    log-probabilities of a policy sampled at that temperature)."""
    z = (hc @ w.t()).float()
    tanh = None
    if softcap:
        tanh = torch.tanh(z / softcap)
        z = softcap * tanh
    if temperature != 1.0:
        z = z / temperature
    return z, tanh


class _ChunkedLogprobs(torch.autograd.Function):
    """log_softmax(h @ W^T)[target] per row, a chunk of rows at a time; recomputed in backward."""

    @staticmethod
    def forward(ctx, h, weight, targets, softcap, chunk, compute_dtype, temperature):
        w = weight.to(compute_dtype)
        out = torch.zeros(h.shape[0], device=h.device, dtype=torch.float32)
        valid = targets != IGNORE_INDEX
        safe = targets.clamp_min(0)
        for s in range(0, h.shape[0], chunk):
            z, _ = _capped_logits(h[s : s + chunk].to(compute_dtype), w, softcap, temperature)
            lse = torch.logsumexp(z, dim=-1)
            lp = z.gather(1, safe[s : s + chunk, None]).squeeze(1) - lse
            out[s : s + chunk] = torch.where(valid[s : s + chunk], lp, 0.0)
        ctx.save_for_backward(h, weight, targets)
        ctx.softcap, ctx.chunk, ctx.compute_dtype, ctx.temperature = softcap, chunk, compute_dtype, temperature
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, weight, targets = ctx.saved_tensors
        softcap, chunk, dtype, temperature = ctx.softcap, ctx.chunk, ctx.compute_dtype, ctx.temperature
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(dtype)
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_w else None
        g = grad_out.float() * (targets != IGNORE_INDEX)
        safe = targets.clamp_min(0)
        for s in range(0, h.shape[0], chunk):
            hc = h[s : s + chunk].to(dtype)
            z, tanh = _capped_logits(hc, w, softcap, temperature)
            gc = g[s : s + chunk] / temperature  # z is the capped logits over the temperature
            # d lp / d z = onehot(target) - softmax(z), times the incoming gradient of each row.
            dz = torch.softmax(z, dim=-1).mul_(-gc[:, None])
            dz.scatter_add_(1, safe[s : s + chunk, None], gc[:, None])
            if tanh is not None:
                dz.mul_(1 - tanh.square())
            dz = dz.to(dtype)
            if need_h:
                grad_h[s : s + chunk] = (dz @ w).to(h.dtype)
            if need_w:
                grad_w += (dz.t() @ hc).float()
        return grad_h, grad_w.to(weight.dtype) if grad_w is not None else None, None, None, None, None, None


def _compute_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device_type = h.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype


def chunked_logprobs(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0,
                     chunk: int = 2048, temperature: float = 1.0) -> torch.Tensor:
    """(N,) log p(targets) of logits = softcap(h @ weight^T) / temperature, for h (N, D); 0 where the
    target is ignored."""
    if not temperature > 0:
        raise ValueError(f"temperature = {temperature}: log-probabilities need a temperature > 0")
    dtype = _compute_dtype(h, weight)
    with torch.autocast(h.device.type, enabled=False):
        return _ChunkedLogprobs.apply(h, weight, targets, float(softcap), int(chunk or 2048), dtype,
                                      float(temperature))


@torch.no_grad()
def chunked_token_stats(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0,
                        chunk: int = 2048, top_k: int = 0, vocab_limit: int | None = None) -> TokenStats:
    """Everything evaluation and serving read off the predicted distribution, for h (N, D).

    `vocab_limit`: ids at or past it (a model padded beyond its tokenizer) never enter the top-k.
    """
    dtype = _compute_dtype(h, weight)
    n = h.shape[0]
    fields = {k: torch.zeros(n, device=h.device) for k in ("logprobs", "entropy", "logp_mean", "logp_std")}
    greedy = torch.zeros(n, dtype=torch.bool, device=h.device)
    top_ids = torch.zeros(n, top_k, dtype=torch.long, device=h.device) if top_k else None
    top_lp = torch.zeros(n, top_k, device=h.device) if top_k else None
    valid = targets != IGNORE_INDEX
    safe = targets.clamp_min(0)
    with torch.autocast(h.device.type, enabled=False):
        w = weight.to(dtype)
        for s in range(0, n, chunk):
            z, _ = _capped_logits(h[s : s + chunk].to(dtype), w, softcap)
            logp = torch.log_softmax(z, dim=-1)
            p = logp.exp()
            mean = (p * logp).sum(-1)
            var = (p * logp.square()).sum(-1) - mean.square()
            v = valid[s : s + chunk]
            lp = logp.gather(1, safe[s : s + chunk, None]).squeeze(1)
            fields["logprobs"][s : s + chunk] = torch.where(v, lp, 0.0)
            fields["entropy"][s : s + chunk] = -mean
            fields["logp_mean"][s : s + chunk] = mean
            fields["logp_std"][s : s + chunk] = var.clamp_min(0).sqrt()
            greedy[s : s + chunk] = (logp.argmax(-1) == safe[s : s + chunk]) & v
            if top_k:
                ranked = logp if vocab_limit is None else logp[:, :vocab_limit]
                values, ids = ranked.topk(top_k, dim=-1)
                top_ids[s : s + chunk], top_lp[s : s + chunk] = ids, values
    return TokenStats(greedy=greedy, top_ids=top_ids, top_logprobs=top_lp, **fields)
