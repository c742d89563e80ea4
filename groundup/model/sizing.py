"""Model sizes: parameters (total, embedding, active), FLOPs per token, weight and KV-cache bytes.

Counts come from the real module built on the meta device, so they can never drift from the code,
and a 12B model costs no memory to size.

FLOPs per token follow the PaLM/Chinchilla convention for one training step (forward + backward):
    6 * N  +  6 * n_layers * n_heads * (d_qk + d_v) * seq_len
where N is the active parameters doing matmuls (everything but the input embedding lookup; the
output projection counts even when tied) and the second term is attention's score and value
products (12 * L * H * Q * T when d_qk = d_v = Q, as in PaLM's appendix B).
"""

from __future__ import annotations

import os

import torch

from groundup.errors import ConfigError
from groundup.model.config import ModelConfig
from groundup.model.moe import MoE
from groundup.model.transformer import Transformer

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1, "int4": 0.5}


def build_meta(cfg: ModelConfig) -> Transformer:
    with torch.device("meta"):
        return Transformer(cfg)


def param_counts(cfg: ModelConfig, model: Transformer | None = None) -> dict[str, int]:
    model = model or build_meta(cfg)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.embed.weight.numel() + (model.lm_head.weight.numel() if model.lm_head is not None else 0)
    inactive = 0
    for moe in model.modules():
        if isinstance(moe, MoE):
            per_expert = (moe.experts_in.numel() + moe.experts_out.numel()) // moe.n_experts
            inactive += (moe.n_experts - moe.top_k) * per_expert
    active = total - inactive
    # Matmul parameters: the embedding lookup does no FLOPs; a tied output projection still does.
    matmul = active - model.embed.weight.numel() + (model.embed.weight.numel() if model.lm_head is None else 0)
    return {"params_total": total, "params_embedding": embedding, "params_active": active,
            "params_non_embedding": total - embedding, "params_matmul_active": matmul}


def attention_dims(cfg: ModelConfig) -> tuple[int, int]:
    """(query/key width, value width) per head."""
    if cfg.attention == "mla":
        return cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
    return cfg.attn_head_dim, cfg.attn_head_dim


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None, counts: dict | None = None) -> int:
    counts = counts or param_counts(cfg)
    seq_len = seq_len or cfg.max_seq_len
    d_qk, d_v = attention_dims(cfg)
    return 6 * counts["params_matmul_active"] + 6 * cfg.n_layers * cfg.n_heads * (d_qk + d_v) * seq_len


def kv_bytes_per_token(cfg: ModelConfig, dtype: str = "bf16") -> float:
    if cfg.attention == "mla":
        per_layer = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    else:
        per_layer = 2 * cfg.kv_heads * cfg.attn_head_dim
    return cfg.n_layers * per_layer * DTYPE_BYTES[dtype]


def mha_kv_bytes_per_token(cfg: ModelConfig, dtype: str = "bf16") -> float:
    """What a plain multi-head cache with the same heads would hold (the MLA/GQA baseline)."""
    d_qk, d_v = attention_dims(cfg)
    return cfg.n_layers * cfg.n_heads * (d_qk + d_v) * DTYPE_BYTES[dtype]


def model_summary(cfg: ModelConfig) -> dict:
    """Everything `groundup model info` prints; the documented JSON keys come first."""
    counts = param_counts(cfg)
    kv = kv_bytes_per_token(cfg)
    return {
        "params_total": counts["params_total"],
        "params_active": counts["params_active"],
        "params_embedding": counts["params_embedding"],
        "flops_per_token": flops_per_token(cfg, counts=counts),
        "weights_bytes_bf16": counts["params_total"] * 2,
        "kv_bytes_per_token": kv,
        "params_non_embedding": counts["params_non_embedding"],
        "weights_bytes_fp32": counts["params_total"] * 4,
        "kv_bytes_full_context": kv * cfg.max_seq_len,
        "kv_bytes_per_token_mha_equivalent": mha_kv_bytes_per_token(cfg),
        "context": cfg.max_seq_len,
    }


def machine_memory(device: torch.device | str = "cpu") -> int:
    """Total memory of the device in bytes: the GPU's, or the machine's RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse


def check_fits(cfg: ModelConfig, device: torch.device | str, bytes_per_param: float, what: str,
               shards: int = 1) -> None:
    """Refuse, before allocating, a model whose `what` needs more than the device has in total."""

    need = cfg.approx_params() * bytes_per_param / max(1, shards)
    have = machine_memory(device)
    if need > have:
        raise ConfigError(f"{cfg.name}: about {cfg.approx_params():.3g} parameters need {need / 2**30:,.1f} GiB for "
                          f"{what} on {device}, which has {have / 2**30:,.1f} GiB in all; choose a smaller model "
                          "or shard it (distributed.strategy = 'fsdp')", key="model")
