"""Activation bytes of one training micro-batch, from the tensors groundup's ops keep for backward.

Every number below names the tensor autograd saves (read transformer.py, attention.py, mlp.py,
moe.py, mla.py and loss.py beside it). N = batch x sequence tokens; `s` = the residual stream's
bytes per number, `c` = the compute dtype's (matmul outputs), `n` = a norm output's.

One pre-norm dense block keeps, in forward order:
    attn_norm    its input x (N d s) and rstd (N fp32); LayerNorm also the mean
    qkv_proj     its input, the norm output (N d n; under autocast the bf16 copy it casts to)
    qk_norm      q and k are views of the qkv output, so it stays alive (N (H + 2 K) D c), + rstds
    RoPE         nothing (cos and sin are shared tables); outputs q (N H D c) and k
    GQA          k and v repeated to H heads (2 N H D c), saved by SDPA; with K = H the SDPA keeps
                 the qkv output alive through v's view instead
    SDPA         q, k, v, the output (N H D c) and the log-sum-exp (N H fp32): no T x T scores
                 (flash / memory-efficient kernels; attention-logit soft-capping takes the
                 explicit path and does keep B H T T scores, modelled here)
    o_proj       its input: on CUDA the (B, T, H D) copy of the attention output (flash returns
                 it head-major); on CPU the kernel's output is already token-major: a view
    residual     x + attn -> x2 (N d s), the MLP norm's input
    mlp_norm     rstd; gate_up_proj its output (N d n)
    gated MLP    gate_up output (N 2f c: silu/gelu keep the gate view, the product the up view),
                 the activation (N f c), the product (N f c) for down_proj
    dropout      a 1-byte mask per element of each dropped tensor (N d per residual branch)
The block's output is the next block's input. A whole-model forward also keeps the last
block's output for the final norm; the fused loss keeps grad_h (N d c) and grad_w (V d) that
it computed in its forward (loss.py). Checkpointing (torch.utils.checkpoint, non-reentrant)
keeps only each block's input and recomputes one block at a time inside backward.

Checked on CPU against torch.profiler (tests/test_plan.py and benchmarks/plan_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from groundup.model.config import ModelConfig
from groundup.plan.params import block_params

FP32 = 4


@dataclass(frozen=True)
class Numerics:
    """Bytes per number of the tensors a step keeps, for one precision mode."""

    mode: str  # fp32, bf16-weights, bf16-autocast
    stream: int  # residual stream (embedding output, residual adds)
    compute: int  # matmul and attention outputs
    norm_out: int  # what a linear layer saves as its input after a norm
    weight: int  # the dtype the forward's weights are in (unsharded / compute copy)
    autocast: bool  # weights are cast per use (and those casts are saved for backward)


def numerics(mode: str) -> Numerics:
    if mode == "fp32":
        return Numerics(mode, FP32, FP32, FP32, FP32, False)
    if mode == "bf16-weights":
        return Numerics(mode, 2, 2, 2, 2, False)
    if mode == "bf16-autocast":
        # fp32 embedding output and residual adds; norms run in fp32 under autocast, and the
        # linear layer saves the bf16 copy it casts its input to.
        return Numerics(mode, FP32, 2, 2, FP32, True)
    raise ValueError(f"unknown precision mode {mode!r}")


@dataclass(frozen=True)
class Layout:
    """How a block's tensors are split over a tensor-parallel group."""

    tp: int = 1
    sequence_parallel: bool = False
    device: str = "cuda"  # cuda or cpu: where kernels' output layouts differ


def cpu_norm_extra(cfg: ModelConfig, rows: float, num: Numerics, lay: Layout, norms: int) -> dict[str, float]:
    """On CPU a bf16 RMSNorm is F.rms_norm's composite (upcast, square, mean, multiply), which
    keeps about 7 more bytes per element than the fused CUDA kernel or groundup's fp32 CPU kernel
    (measured: 3.5 x N d x 2 bytes per norm)."""
    if lay.device == "cpu" and num.stream != FP32 and cfg.norm == "rmsnorm":  # bf16 input (not autocast)
        return {"norm_cpu_composite": norms * rows * cfg.d_model * 7}
    return {}


def _norm_saved(cfg: ModelConfig, rows: float) -> float:
    """rstd (and LayerNorm's mean) per row, fp32."""
    return rows * FP32 * (2 if cfg.norm == "layernorm" else 1)


def attention_path(cfg: ModelConfig, device: str) -> str:
    """Which kernel attention takes in training: "fused" (SDPA flash / memory-efficient: no T x T
    scores), "math" (SDPA's fallback on CPU for dropout or a value width unlike the query's: it
    keeps the scores) or "explicit" (attention-logit soft-capping needs the scores itself)."""
    if cfg.attn_logit_softcap:
        return "explicit"
    d_qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim if cfg.attention == "mla" else cfg.attn_head_dim
    d_v = cfg.v_head_dim if cfg.attention == "mla" else cfg.attn_head_dim
    if device == "cpu" and (cfg.dropout or d_qk != d_v):
        return "math"
    return "fused"


def attention_saved(cfg: ModelConfig, B: int, T: int, num: Numerics, lay: Layout) -> dict[str, float]:
    N, c, t = B * T, num.compute, lay.tp
    H = cfg.n_heads / t
    path = attention_path(cfg, lay.device)
    parts: dict[str, float] = {}
    if cfg.attention == "mla":
        nope, rope, v_dim, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        d_qk = nope + rope
        if cfg.q_lora_rank:  # q_down output (kept by q_norm) and q_norm output (kept by q_up)
            parts["q_latent"] = N * cfg.q_lora_rank * (2 * c) + _norm_saved(cfg, N)
        # kv_down output (kv_norm keeps the c_kv view), kv_norm output (kv_up's input) and rstd
        parts["kv_latent"] = N * (r + rope) * c + N * r * c + _norm_saved(cfg, N)
        # kv_up output (kept alive through v's view), q and k concatenated with the RoPE parts
        parts["kv_up"] = N * H * (nope + v_dim) * c
        parts["qk"] = 2 * N * H * d_qk * c
        d_v = v_dim
    else:
        K, D = cfg.kv_heads / t, cfg.attn_head_dim
        d_qk = d_v = D
        qkv = N * (H + 2 * K) * D * c
        if cfg.qk_norm:  # q and k views keep the qkv output; rstd per head
            parts["qkv_kept_by_qk_norm"] = qkv
            parts["qk_norm"] = N * (H + K) * FP32
        parts["q_rope"] = N * H * D * c
        if path == "explicit":  # grouped matmuls: k as is, v a view that keeps the qkv output
            parts["k_rope"] = N * K * D * c
            if not cfg.qk_norm:
                parts["qkv_kept_by_v"] = qkv
        elif cfg.kv_heads < cfg.n_heads:
            parts["kv_repeated"] = 2 * N * H * D * c
        else:  # SDPA keeps k (RoPE output) and v, a view of the qkv output
            parts["k_rope"] = N * H * D * c
            if not cfg.qk_norm:
                parts["qkv_kept_by_v"] = qkv
    scores = B * H * T * T
    if path == "fused":
        parts["attn_out"] = N * H * d_v * c + N * H * FP32  # SDPA output and log-sum-exp
    else:
        parts["attn_out"] = N * H * d_v * c
    if path == "math":  # softmax output (+ dropout mask and output), the scaled query (twice)
        parts["attn_scores"] = scores * c * (3 if cfg.dropout else 1) + 2 * N * H * d_qk * c
    if path == "explicit":  # tanh and softmax outputs in fp32, the probabilities cast back, dropout
        parts["attn_scores"] = scores * (2 * FP32 + (c if c != FP32 else 0) + (2 * c if cfg.dropout else 0))
    if lay.device == "cuda" or path == "explicit":
        parts["o_proj_input"] = N * H * d_v * c  # the head-major output copied token-major
    return parts


def mlp_saved(cfg: ModelConfig, layer: int, B: int, T: int, num: Numerics, lay: Layout) -> dict[str, float]:
    N, c, t = B * T, num.compute, lay.tp
    parts: dict[str, float] = {}

    def dense(f: float, rows: float, name: str) -> None:
        if cfg.gated:  # gate_up output (kept by the activation and the product), activation, product
            parts[name] = rows * (2 * f + f + f) * c
        elif cfg.mlp == "relu2":  # up output, relu output (kept by square), square output
            parts[name] = rows * 3 * f * c
        else:  # up output (kept by gelu), gelu output
            parts[name] = rows * 2 * f * c

    if not cfg.is_moe_layer(layer):
        dense(cfg.ffn_dim / t, N, "mlp")
        return parts
    E, k, d, f = cfg.n_experts, cfg.moe_top_k, cfg.d_model, cfg.expert_ffn_dim / t
    # router logits (fp32) and probabilities, chosen indices (int64) and gate weights
    parts["moe_routing"] = N * E * 2 * FP32 + N * k * (8 + 2 * FP32) + N * k * 8
    # tokens gathered per (token, slot): the inputs, expert outputs and gated outputs
    parts["moe_dispatch"] = N * k * d * c * 3
    dense(f, N * k, "moe_experts")
    if cfg.n_shared_experts:
        dense(cfg.expert_ffn_dim * cfg.n_shared_experts / t, N, "moe_shared")
    return parts


def block_saved(cfg: ModelConfig, layer: int, B: int, T: int, num: Numerics, lay: Layout) -> dict[str, float]:
    """Bytes one block keeps for backward, its input included, its output not."""
    N, d = B * T, cfg.d_model
    rows = N / lay.tp if lay.sequence_parallel else N  # norms and residuals: split by sequence parallelism
    parts = {"block_input": rows * d * num.stream}
    norm_inputs = 2 if cfg.norm_placement != "sandwich" else 4
    parts["norm_stats"] = norm_inputs * _norm_saved(cfg, rows)
    # the two linear layers that read a norm output save it (sequence parallel all-gathers it first)
    parts["norm_outputs"] = 2 * N * d * num.norm_out
    parts["residual"] = rows * d * num.stream  # x + attention: the MLP norm's input
    parts.update(cpu_norm_extra(cfg, rows, num, lay, norm_inputs))
    if cfg.norm_placement == "sandwich":  # the post-norms keep the sub-layers' outputs
        parts["post_norm_inputs"] = 2 * rows * d * num.compute
    if cfg.dropout:
        parts["dropout_masks"] = 2 * rows * d * 1
    parts.update(attention_saved(cfg, B, T, num, lay))
    parts.update(mlp_saved(cfg, layer, B, T, num, lay))
    if num.autocast:  # each linear saves the bf16 copy of its weight that autocast made
        parts["weight_casts"] = _block_matmul_params(cfg, layer) / lay.tp * 2
    return parts


def _block_matmul_params(cfg: ModelConfig, layer: int) -> float:
    return block_params(cfg, layer)["matmul"]


def block_backward_extra(cfg: ModelConfig, layer: int, B: int, T: int, num: Numerics, lay: Layout) -> float:
    """Working set of one block's backward above what it saved: gradients of the incoming and
    outgoing stream, and the largest gradient of an intermediate (the MLP's, measured on CPU:
    1.5 N f for a gated MLP, 0.75 N f otherwise), plus the recompute's forward working set."""
    N, d, c, t = B * T, cfg.d_model, num.compute, lay.tp
    rows = N / t if lay.sequence_parallel else N
    if cfg.is_moe_layer(layer):
        f = (cfg.expert_ffn_dim / t) * cfg.moe_top_k
    else:
        f = cfg.ffn_dim / t
    mlp = (1.5 if cfg.gated else 0.75) * N * f * c
    if cfg.attention == "mla":
        attn = N * (cfg.n_heads / t) * (2 * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) + cfg.v_head_dim) * c
    else:
        attn = N * (cfg.n_heads + 2 * cfg.kv_heads) / t * cfg.attn_head_dim * c
    return 2 * rows * d * num.stream + max(mlp, attn)


def forward_extra(cfg: ModelConfig, B: int, T: int, num: Numerics, lay: Layout) -> float:
    """The transient of one block's forward above what it keeps (the qkv output, a linear's output
    before the residual add); measured about 2 N d on CPU for the tiny shapes."""
    N, t = B * T, lay.tp
    if cfg.attention == "mla":
        qkv = N * cfg.n_heads / t * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) * num.compute
    else:
        qkv = N * (cfg.n_heads + 2 * cfg.kv_heads) / t * cfg.attn_head_dim * num.compute
    return qkv + N * cfg.d_model * num.stream


@dataclass
class LossBytes:
    """The fused output layer + cross-entropy (loss.py): never the full B x T x V logits."""

    saved: float  # grad_h and grad_w kept from its forward until backward reaches it
    forward_peak: float  # the most it holds at once in its forward: saved buffers + one chunk's working set
    chunk_logits: float  # one chunk of rows x vocab logits in fp32 (the part a full-logits loss multiplies)
    full_logits: float  # what the unfused path would hold: B T V fp32 logits and their gradient


def loss_bytes(cfg: ModelConfig, B: int, T: int, num: Numerics, lay: Layout) -> LossBytes:
    N, d, c, t = B * T, cfg.d_model, num.compute, lay.tp
    V = cfg.vocab_size / t  # vocabulary-parallel output layer under tensor parallelism
    rows = min(cfg.loss_chunk_size or N, N)
    grad_h = N * d * c
    w_dtype = num.weight
    full_logits = N * V * FP32 * 2
    if not cfg.loss_chunk_size:
        # plain path: the logits (in the compute dtype and fp32; the step's output holds them),
        # log_softmax's output, and in backward their two gradients
        logits = N * V * FP32
        cast = N * V * c if c != FP32 else 0
        return LossBytes(2 * logits + cast, grad_h + 4 * logits + cast, logits, full_logits)
    chunk = rows * V * FP32
    # grad_w accumulates in fp32; each chunk adds (g.T @ h) made in the compute dtype (and its fp32
    # copy when that is bf16); the logits chunk is made in the compute dtype, then fp32, and the
    # gradient chunk is cast back to the compute dtype for the two matmuls.
    grad_w_acc = V * d * FP32
    # per chunk: the logits block (made in the compute dtype, then fp32; the gradient cast back to
    # the compute dtype beside it) and g.T @ h in the compute dtype (plus its fp32 copy for bf16)
    chunk_work = chunk + (rows * V * c if c != FP32 else 0) + rows * d * c
    product = V * d * c + (V * d * FP32 if c != FP32 else 0)
    weight_cast = V * d * c if w_dtype != c else 0  # autocast: weight.to(bf16) for the whole loss
    saved = grad_h + V * d * w_dtype
    forward_peak = grad_h + grad_w_acc + weight_cast + chunk_work + product
    return LossBytes(saved, forward_peak, chunk, full_logits)
