"""Which Hugging Face architecture expresses a groundup ModelConfig, and its `config.json` (the way back is
hf_import_config).

    Llama        pre-norm RMSNorm, RoPE (linear scaling too), MHA/GQA/MQA, SwiGLU or GeGLU, biases
    Qwen2        Llama with biases on q, k and v only (qkv_bias), no sliding window
    Qwen3        Llama + QK-norm (no biases)
    Gemma 2      sandwich norms + embedding scaling (+ attention/final logit soft-capping)
    Gemma 3      Gemma 2 + QK-norm
    Mixtral      GQA + MoE: softmax router, renormalised top-k, every layer routed
    Qwen3-MoE    Qwen3 + MoE: softmax router, top-k renormalised or not, leading dense layers
    DeepSeek-V2  MLA (dense, or MoE with a softmax router whose top-k weights are not renormalised)
    DeepSeek-V3  MLA + MoE with a sigmoid router and a selection bias (auxiliary-loss-free balancing)

Anything else (LayerNorm, post-norm, non-gated MLPs, soft-capping without Gemma's sandwich norms,
...) is refused with a message naming the feature: an architecture that only approximately matches
would load, run and silently give other outputs. Static NTK scaling is a larger RoPE base, exported
as such. The keys written are those the models' own Hub configs use (`rope_theta`, `rope_scaling`,
`num_experts`, ...), which transformers 4.x and 5.x and other runtimes all read.
"""

from __future__ import annotations

import dataclasses

from groundup.config import ConfigError
from groundup.model.config import ModelConfig

CLASSES = {
    "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
}
ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh"}
GROUNDUP_KEY = "groundup_model_config"  # the full ModelConfig, so a round trip restores training fields too
MLA_NORM_EPS = 1e-6  # transformers' DeepSeek normalises the MLA latents with this eps, not rms_norm_eps


def _refuse(key: str, value, why: str):
    raise ConfigError(f"cannot export {key} = {value!r} to Hugging Face: {why}", key=key)


def choose_architecture(cfg: ModelConfig, expert_bias_is_zero: bool = True) -> str:
    """The model_type that computes exactly what `cfg` does, or ConfigError naming the obstacle."""
    if cfg.value_head:
        _refuse("value_head", True, "a reward model is not a causal language model; groundup exports causal LMs")
    if cfg.norm != "rmsnorm":
        _refuse("norm", cfg.norm, "the RoPE architectures transformers runs natively (Llama, Qwen3, Gemma, "
                "Mixtral, DeepSeek) all use RMSNorm")
    if cfg.norm_placement == "post":
        _refuse("norm_placement", cfg.norm_placement, "no standard decoder normalises after the residual add")
    if not cfg.gated:
        _refuse("mlp", cfg.mlp, "the standard RoPE architectures use gated MLPs (SwiGLU or GeGLU)")
    sandwich = cfg.norm_placement == "sandwich"
    if sandwich or cfg.embed_scale:
        return _gemma(cfg, sandwich)
    for key in ("attn_logit_softcap", "final_logit_softcap"):
        if getattr(cfg, key):
            _refuse(key, getattr(cfg, key), "only Gemma 2/3 soft-cap logits, and they also need "
                    "norm_placement = 'sandwich' and embed_scale = true")
    if cfg.attention == "mla":
        return _deepseek(cfg, expert_bias_is_zero)
    if cfg.d_model % cfg.n_heads:
        _refuse("head_dim", cfg.head_dim, f"transformers requires d_model ({cfg.d_model}) divisible by n_heads")
    if cfg.n_experts:
        return _gqa_moe(cfg, expert_bias_is_zero)
    if cfg.qk_norm:
        if cfg.bias or cfg.qkv_bias:
            key = "bias" if cfg.bias else "qkv_bias"
            _refuse(key, True, "Qwen3 (the QK-norm architecture) has no biases")
        return "qwen3"
    if cfg.qkv_bias and not cfg.bias:  # q, k, v biased, o and the MLP not: exactly Qwen2
        return "qwen2"
    return "llama"


def _gemma(cfg: ModelConfig, sandwich: bool) -> str:
    if not (sandwich and cfg.embed_scale):
        key = "embed_scale" if sandwich else "norm_placement"
        _refuse(key, getattr(cfg, key), "Gemma 2/3, the only standard architecture with sandwich norms or "
                "embedding scaling, has both: set norm_placement = 'sandwich' and embed_scale = true")
    if cfg.attention == "mla" or cfg.n_experts:
        _refuse("attention" if cfg.attention == "mla" else "n_experts", cfg.attention if cfg.attention == "mla"
                else cfg.n_experts, "Gemma (sandwich norms) has neither MLA nor MoE")
    if cfg.bias or cfg.qkv_bias:
        _refuse("bias" if cfg.bias else "qkv_bias", True, "Gemma has no biases")
    return "gemma3_text" if cfg.qk_norm else "gemma2"


def _deepseek(cfg: ModelConfig, expert_bias_is_zero: bool) -> str:
    if cfg.bias:
        _refuse("bias", True, "DeepSeek-V2/V3 (the MLA architectures) have no MLP biases")
    if cfg.norm_eps != MLA_NORM_EPS:
        _refuse("norm_eps", cfg.norm_eps, f"transformers' DeepSeek-V2/V3 normalise MLA latents with eps {MLA_NORM_EPS}")
    if cfg.rope_scaling == "linear":
        _refuse("rope_scaling", "linear", "DeepSeek-V2/V3 in transformers scale RoPE with YaRN only")
    if not cfg.n_experts:
        return "deepseek_v2"
    if cfg.moe_router == "sigmoid":
        return "deepseek_v3"
    if cfg.moe_norm_topk:
        _refuse("moe_norm_topk", True, "DeepSeek-V2 (softmax router) never renormalises the top-k weights; "
                "DeepSeek-V3 does, with a sigmoid router")
    if not expert_bias_is_zero:
        _refuse("moe_bias_update_rate", cfg.moe_bias_update_rate, "the experts' selection bias is only expressed "
                "by DeepSeek-V3, whose router is a sigmoid (moe_router = 'sigmoid')")
    return "deepseek_v2"


def _gqa_moe(cfg: ModelConfig, expert_bias_is_zero: bool) -> str:
    if cfg.moe_router != "softmax":
        _refuse("moe_router", cfg.moe_router, "the sigmoid router is DeepSeek-V3's, which needs attention = 'mla'")
    if not expert_bias_is_zero:
        _refuse("moe_bias_update_rate", cfg.moe_bias_update_rate, "a nonzero expert selection bias exists only in "
                "DeepSeek-V3 (MLA + sigmoid router); train with moe_bias_update_rate = 0 to export to "
                "Mixtral or Qwen3-MoE")
    if cfg.n_shared_experts:
        _refuse("n_shared_experts", cfg.n_shared_experts, "with GQA only Qwen2-MoE has a shared expert, and it "
                "gates it; ungated shared experts need attention = 'mla' (DeepSeek)")
    if cfg.bias or cfg.qkv_bias:
        _refuse("bias" if cfg.bias else "qkv_bias", True, "Mixtral and Qwen3-MoE have no biases")
    if cfg.qk_norm:
        return "qwen3_moe"
    if cfg.n_dense_layers or not cfg.moe_norm_topk:
        key = "n_dense_layers" if cfg.n_dense_layers else "moe_norm_topk"
        _refuse(key, getattr(cfg, key), "Mixtral routes every layer and renormalises the top-k weights; the "
                "MoE architecture with dense layers and either top-k rule (Qwen3-MoE) also needs qk_norm = true")
    return "mixtral"


# ---------------------------------------------------------------------------- config.json


def hf_config(arch: str, cfg: ModelConfig, special_ids: dict[str, int], dtype: str) -> dict:
    """The config.json of `cfg` as `arch` (from `choose_architecture`)."""
    theta, scaling = cfg.rope_theta, None
    rope_dim = cfg.qk_rope_head_dim if cfg.attention == "mla" else cfg.attn_head_dim
    if cfg.rope_scaling == "ntk":  # static NTK scaling is exactly a larger base
        theta = cfg.rope_theta * cfg.rope_scaling_factor ** (rope_dim / (rope_dim - 2))
    elif cfg.rope_scaling == "linear":
        scaling = {"rope_type": "linear", "type": "linear", "factor": cfg.rope_scaling_factor}
    c = {
        "architectures": [CLASSES[arch]], "model_type": arch,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": rope_dim,
        "intermediate_size": cfg.ffn_dim, "hidden_act": ACTIVATIONS[cfg.mlp],
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": theta, "rope_scaling": scaling, "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.bias, "attention_dropout": 0.0, "initializer_range": cfg.init_std,
        "bos_token_id": special_ids.get("bos"), "eos_token_id": special_ids.get("eot"),
        "pad_token_id": special_ids.get("pad"),
        "torch_dtype": dtype, "use_cache": True,
    }
    full_layers = ["full_attention"] * cfg.n_layers
    if arch == "llama":
        c["mlp_bias"] = cfg.bias
    elif arch in ("qwen2", "qwen3", "qwen3_moe"):
        c.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layers, layer_types=full_layers)
        if arch == "qwen2":  # its q, k, v always carry biases and o never does: no switch to set
            del c["attention_bias"]
    elif arch in ("gemma2", "gemma3_text"):
        c["hidden_activation"] = c.pop("hidden_act")
        c.update(query_pre_attn_scalar=cfg.attn_head_dim, sliding_window=cfg.max_seq_len, layer_types=full_layers,
                 attn_logit_softcapping=cfg.attn_logit_softcap or None,
                 final_logit_softcapping=cfg.final_logit_softcap or None)
        if arch == "gemma3_text":  # per-layer-type RoPE; every layer here is a global one
            rope = {"rope_type": "default", "rope_theta": theta, **(scaling or {})}
            rope.pop("type", None)
            c.update(rope_parameters={"full_attention": rope, "sliding_attention": dict(rope)},
                     rope_local_base_freq=theta, use_bidirectional_attention=False)
            del c["rope_scaling"]
    if cfg.n_experts and arch in ("mixtral", "qwen3_moe"):
        c.update(num_experts_per_tok=cfg.moe_top_k, router_aux_loss_coef=cfg.moe_aux_loss_coef,
                 output_router_logits=False)
        if arch == "mixtral":
            c.update(num_local_experts=cfg.n_experts, intermediate_size=cfg.expert_ffn_dim, sliding_window=None)
        else:
            c.update(num_experts=cfg.n_experts, moe_intermediate_size=cfg.expert_ffn_dim,
                     norm_topk_prob=cfg.moe_norm_topk, decoder_sparse_step=1,
                     mlp_only_layers=list(range(cfg.n_dense_layers)))
    if arch.startswith("deepseek"):
        c.update(num_key_value_heads=cfg.n_heads, q_lora_rank=cfg.q_lora_rank or None,
                 kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
                 qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
                 n_routed_experts=cfg.n_experts, n_shared_experts=cfg.n_shared_experts,
                 num_experts_per_tok=cfg.moe_top_k,
                 moe_intermediate_size=cfg.expert_ffn_dim,
                 first_k_dense_replace=cfg.n_dense_layers if cfg.n_experts else cfg.n_layers,
                 norm_topk_prob=cfg.moe_norm_topk, routed_scaling_factor=1.0, n_group=1, topk_group=1,
                 topk_method="greedy")
        if arch == "deepseek_v3":
            c.update(rope_interleave=True, num_nextn_predict_layers=0)
    c[GROUNDUP_KEY] = dataclasses.asdict(cfg)
    return c
