"""The language-model loss: cross-entropy over the vocabulary plus the PaLM z-loss.

`fused_linear_cross_entropy` computes the output projection, the loss and both gradients chunk
by chunk in the forward pass (as Liger-Kernel does on GPU), so the full (tokens x vocabulary)
logits and their gradient never exist at once, and the backward pass only scales the saved
gradients. That saves (tokens x vocab) floats of memory and the separate softmax backward, which
dominates a small model's step with an 8K+ vocabulary.

Both paths compute, over positions whose target is not `IGNORE_INDEX`:
    ce     = mean(logsumexp(z) - z[target])
    z_loss = mean(logsumexp(z)^2)          (PaLM: coefficient 1e-4, keeps log Z near 0)
    loss   = ce + z_loss_coef * z_loss
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def cross_entropy_with_z(logits: torch.Tensor, targets: torch.Tensor, z_coef: float = 0.0
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, ce, z_loss) from materialised logits (N, V) and targets (N,)."""
    logits = logits.float()
    valid = targets != IGNORE_INDEX
    n_valid = valid.sum().clamp_min(1)
    ce = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum") / n_valid
    if not z_coef:
        return ce, ce.detach(), torch.zeros((), device=logits.device)
    lse = torch.logsumexp(logits, dim=-1)
    z = (lse.square() * valid).sum() / n_valid
    return ce + z_coef * z, ce.detach(), z.detach()


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, z_coef, softcap, chunk, compute_dtype):
        n_rows = h.shape[0]
        valid = targets != IGNORE_INDEX
        n_valid = valid.sum().clamp_min(1)
        need_grad_h, need_grad_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(compute_dtype)
        ce_sum = torch.zeros((), device=h.device, dtype=torch.float32)
        z_sum = torch.zeros((), device=h.device, dtype=torch.float32)
        grad_h = torch.empty_like(h) if need_grad_h else None
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_grad_w else None
        for s in range(0, n_rows, chunk):
            hc = h[s : s + chunk].to(compute_dtype)
            tc, vc = targets[s : s + chunk], valid[s : s + chunk].float()
            logits = (hc @ w.t()).float()
            if softcap:
                tanh = torch.tanh(logits / softcap)
                logits = softcap * tanh
            safe_t = tc.clamp_min(0).unsqueeze(1)
            target_logit = logits.gather(1, safe_t).squeeze(1)
            # logsumexp by hand, in place: exp(z - max) is also the unnormalised softmax the
            # gradient needs, so the (rows x vocab) block is exponentiated once, not twice.
            peak = logits.amax(dim=-1, keepdim=True)
            e = logits.sub_(peak).exp_()
            total = e.sum(dim=-1)
            lse = peak.squeeze(1) + total.log()
            ce_sum += ((lse - target_logit) * vc).sum()
            z_sum += (lse.square() * vc).sum()
            if not (need_grad_h or need_grad_w):
                continue
            # d(ce)/dz = softmax - onehot; d(z_coef * lse^2)/dz = 2 z_coef lse softmax; softmax = e / total.
            g = e.mul_(((1 + 2 * z_coef * lse) * vc / (n_valid * total)).unsqueeze(1))
            g.scatter_add_(1, safe_t, (-vc / n_valid).unsqueeze(1))
            if softcap:
                g.mul_(1 - tanh.square())
            g = g.to(compute_dtype)
            if need_grad_h:
                grad_h[s : s + chunk] = (g @ w).to(h.dtype)
            if need_grad_w:
                grad_w += (g.t() @ hc).float()
        ce = ce_sum / n_valid
        z = z_sum / n_valid
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype) if grad_w is not None else None)
        ctx.mark_non_differentiable(ce, z)
        return ce + z_coef * z, ce, z

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_z):
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_loss.to(grad_h.dtype) if grad_h is not None else None
        gw = grad_w * grad_loss.to(grad_w.dtype) if grad_w is not None else None
        return gh, gw, None, None, None, None, None


def fused_linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               z_coef: float = 0.0, softcap: float = 0.0, chunk: int = 2048
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, ce, z_loss) of logits = h @ weight.T, without materialising all of them.

    h (N, D), weight (V, D), targets (N,). Under autocast the matmuls run in the autocast dtype
    and the softmax in float32, like the unfused path.
    """
    device_type = h.device.type
    if torch.is_autocast_enabled(device_type):
        compute_dtype = torch.get_autocast_dtype(device_type)
    else:
        compute_dtype = weight.dtype
    with torch.autocast(device_type, enabled=False):
        return _FusedLinearCrossEntropy.apply(h, weight, targets, float(z_coef), float(softcap), int(chunk),
                                              compute_dtype)
