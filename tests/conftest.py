"""Shared test fixtures: tiny model configs (d_model 64, 2 layers) and deterministic seeds."""

from __future__ import annotations

import pytest
import torch

from groundup.config import from_dict
from groundup.model import ModelConfig

torch.set_num_threads(min(2, torch.get_num_threads()))

MLA = {"attention": "mla", "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}

# Every architectural variant the model supports, on the tiny preset.
VARIANTS = {
    "gqa": {},
    "mha": {"n_kv_heads": 4},
    "mqa": {"n_kv_heads": 1},
    "qk_norm": {"qk_norm": True},
    "softcaps": {"attn_logit_softcap": 5.0, "final_logit_softcap": 10.0},
    "mla": MLA,
    "mla_q_lora": {**MLA, "q_lora_rank": 24},
    "moe": {"n_experts": 4, "moe_top_k": 2, "n_shared_experts": 1, "n_dense_layers": 1},
    "moe_sigmoid": {"n_experts": 4, "moe_top_k": 2, "moe_router": "sigmoid"},
    "mla_moe": {**MLA, "n_experts": 4, "moe_top_k": 2},
    "post_norm_gpt2": {"norm_placement": "post", "norm": "layernorm", "bias": True, "mlp": "gelu"},
    "sandwich_geglu": {"norm_placement": "sandwich", "mlp": "geglu", "embed_scale": True},
    "relu2_untied": {"mlp": "relu2", "tie_embeddings": False},
    "rope_ntk": {"rope_scaling": "ntk", "rope_scaling_factor": 4.0},
}


def tiny_config(**overrides) -> ModelConfig:
    return from_dict(ModelConfig, {"preset": "tiny", "vocab_size": 256, **overrides})


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
