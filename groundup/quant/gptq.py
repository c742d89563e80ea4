"""GPTQ (Frantar et al., 2022): quantize a weight column by column, correcting the columns not yet
quantized for each column's error, using the layer inputs' Hessian H = 2 X^T X.

For a layer y = W x and calibration inputs X, GPTQ minimises ||W X^T - Q X^T||^2 over the
integer grid. Column j is rounded, and its error, divided by [H^-1]_jj, is spread over the later
columns through row j of the upper Cholesky factor of H^-1 (the optimal brain surgeon update).
As in the paper's reference implementation:

- dampening: H += 0.01 * mean(diag H) * I (`damp`); inputs never seen (diag 0) get H_jj = 1 and
  their weight column is zeroed;
- blocks of 128 columns: updates inside a block are applied at once per column, and the block's
  accumulated error reaches the columns after it in one matmul (lazy batch updates);
- int4: a group's scale and zero point are chosen when the sweep reaches the group's first column,
  from the weights as updated so far (groups never straddle a block: 128 is a multiple of 32, 64, 128);
  int8: one symmetric scale per output channel, from the original weights;
- act-order (`act_order`): columns in order of decreasing H_jj, so the columns with the largest
  inputs are quantized while the most columns remain to absorb their error. Groups stay groups of
  *consecutive original* columns ("static groups": their parameters come from the original
  weights before the sweep), and the integers are put back in the original column order, so the
  stored weight needs no permutation index (g_idx) and runs on the same kernels as RTN int4.

`relative_error(W, Q, H)` = ||(W - Q) X^T||^2 / ||W X^T||^2 = tr(D H D^T) / tr(W H W^T): what the
quantize verb reports per layer, for GPTQ and for round-to-nearest on the same inputs.
"""

from __future__ import annotations

import torch

from groundup.quant.formats import INT4_MAX, INT8_MAX, int4_params, int8_scales

BLOCK_SIZE = 128
DAMP = 0.01


class Hessian:
    """Running H = (2 / n) sum_i x_i x_i^T over the rows of every batch added."""

    def __init__(self, dim: int, device: torch.device | str):
        self.H = torch.zeros(dim, dim, dtype=torch.float32, device=device)
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()
        m = x.shape[0]
        if m == 0:
            return
        self.H *= self.n / (self.n + m)
        self.n += m
        x = x * (2.0 / self.n) ** 0.5
        self.H.addmm_(x.t(), x)


def relative_error(W: torch.Tensor, Q: torch.Tensor, H: torch.Tensor) -> float:
    """||(W - Q) X^T||^2 / ||W X^T||^2 for the inputs X behind H."""
    W, Q = W.float(), Q.float()
    D = W - Q
    num = ((D @ H) * D).sum()
    den = ((W @ H) * W).sum()
    return float(num / den) if den > 0 else 0.0


def error_terms(W: torch.Tensor, Q: torch.Tensor, H: torch.Tensor) -> tuple[float, float]:
    """The numerator and denominator of relative_error (to aggregate over experts)."""
    W, Q = W.float(), Q.float()
    D = W - Q
    return float(((D @ H) * D).sum()), float(((W @ H) * W).sum())


def gptq(W: torch.Tensor, H: torch.Tensor, fmt: str, group_size: int | None = None, act_order: bool = False,
         block_size: int = BLOCK_SIZE, damp: float = DAMP
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """GPTQ of one (N, K) weight. Returns (integers (N, K) as float: -127..127 for int8, 0..15 for
    int4; scales (N,) or (N, K/g); zeros (N, K/g) or None; the dequantized weight (N, K))."""
    W = W.detach().float().clone()
    H = H.detach().float().clone()
    N, K = W.shape
    if fmt == "int4" and (K % group_size or block_size % group_size):
        raise ValueError(f"GPTQ: {K} columns or block size {block_size} not a multiple of group size {group_size}")
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0

    if fmt == "int8":
        scales, zeros = int8_scales(W), None
    else:
        G = K // group_size
        if act_order:  # static groups: parameters from the original weights
            scales, zeros = int4_params(W.reshape(N, G, group_size))
        else:
            scales = torch.zeros(N, G, device=W.device)
            zeros = torch.zeros(N, G, device=W.device)

    perm = None
    if act_order:
        perm = torch.argsort(torch.diagonal(H), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
        group_of = (perm // group_size).tolist() if fmt == "int4" else None  # original group of each column

    H.diagonal().add_(damp * torch.diagonal(H).mean())
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

    Qint = torch.zeros_like(W)
    Qdeq = torch.zeros_like(W)
    for i1 in range(0, K, block_size):
        i2 = min(i1 + block_size, K)
        W1 = W[:, i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            w = W1[:, i]
            if fmt == "int8":
                q = torch.clamp(torch.round(w / scales), -INT8_MAX, INT8_MAX)
                deq = q * scales
            else:
                if act_order:
                    g = group_of[col]
                elif col % group_size == 0:
                    g = col // group_size
                    scales[:, g], zeros[:, g] = int4_params(W1[:, i : i + group_size])
                else:
                    g = col // group_size
                s, z = scales[:, g], zeros[:, g]
                q = torch.clamp(torch.round(w / s) + z, 0, INT4_MAX)
                deq = (q - z) * s
            Qint[:, col], Qdeq[:, col] = q, deq
            err = (w - deq) / Hinv1[i, i]
            W1[:, i:] -= err.unsqueeze(1) * Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]

    if perm is not None:
        inv = torch.argsort(perm)
        Qint, Qdeq = Qint[:, inv], Qdeq[:, inv]
    return Qint, scales, zeros, Qdeq
