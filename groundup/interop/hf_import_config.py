"""A Hugging Face config.json read back into a ModelConfig (the inverse of `hf_config.hf_config`).

Every option that changes what the model computes is checked; one groundup cannot reproduce
(sliding windows, YaRN or Llama-3 RoPE scaling, grouped expert routing, scaled routing weights,
biases on attention but not the MLP, ...) is refused by name rather than silently dropped.
"""

from __future__ import annotations

from groundup.config import ConfigError, from_dict
from groundup.schema import check
from groundup.interop.hf_config import ACTIVATIONS, CLASSES, GROUNDUP_KEY, MLA_NORM_EPS, hf_config
from groundup.model.config import ModelConfig

_MLPS = {**{v: k for k, v in ACTIVATIONS.items()}, "swish": "swiglu", "gelu_new": "geglu"}


def parse_hf_config(arch: str, c: dict, where: str) -> ModelConfig:
    def refuse(key: str, why: str):
        raise ConfigError(f"{where}: cannot import {key} = {c.get(key)!r}: {why}", key=key)

    def need(key: str):
        if c.get(key) is None:
            raise ConfigError(f"{where}: missing {key!r}, which {arch} needs", key=key)
        return c[key]

    gemma = arch in ("gemma2", "gemma3_text")
    act_key = "hidden_activation" if gemma and c.get("hidden_activation") else "hidden_act"
    if c.get(act_key, "silu") not in _MLPS:
        refuse(act_key, f"groundup's gated MLPs use {' or '.join(ACTIVATIONS.values())}")
    n_heads = need("num_attention_heads")
    f = dict(
        name=c.get("_name_or_path") or arch, vocab_size=need("vocab_size"), d_model=need("hidden_size"),
        n_layers=need("num_hidden_layers"), n_heads=n_heads, n_kv_heads=c.get("num_key_value_heads") or n_heads,
        max_seq_len=need("max_position_embeddings"), mlp=_MLPS[c.get(act_key, "silu")],
        d_ff=need("intermediate_size"), norm_eps=c.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(c.get("tie_word_embeddings", gemma)), init_std=c.get("initializer_range", 0.02),
    )
    head_dim = c.get("head_dim")
    if head_dim and head_dim != f["d_model"] // n_heads and arch[:8] != "deepseek":
        f["head_dim"] = head_dim
    f.update(_rope(arch, c, refuse))
    _check_full_attention(arch, c, refuse)
    bias = bool(c.get("attention_bias", False)) and arch != "qwen2"  # Qwen2 has no switch: q, k, v always
    if arch == "llama" and bias != bool(c.get("mlp_bias", False)):
        refuse("mlp_bias", "groundup's `bias` puts biases on attention and MLP alike")
    if bias and arch != "llama":
        refuse("attention_bias", f"groundup's `bias` also biases the MLP, which {arch} does not")
    f["bias"] = bias
    if arch == "qwen2":
        f["qkv_bias"] = True
    if arch in ("qwen3", "qwen3_moe", "gemma3_text"):
        f["qk_norm"] = True
    if gemma:
        if c.get("query_pre_attn_scalar", head_dim) != (head_dim or f["d_model"] // n_heads):
            refuse("query_pre_attn_scalar", "groundup scales attention scores by 1/sqrt(head_dim)")
        f.update(norm_placement="sandwich", embed_scale=True, attn_logit_softcap=c.get("attn_logit_softcapping") or 0.0,
                 final_logit_softcap=c.get("final_logit_softcapping") or 0.0)
    if arch == "mixtral":
        f.update(n_experts=need("num_local_experts"), moe_top_k=need("num_experts_per_tok"), moe_norm_topk=True,
                 moe_bias_update_rate=0.0)
    elif arch == "qwen3_moe":
        f.update(_qwen3_moe(c, need, refuse))
    elif arch.startswith("deepseek"):
        f.update(_deepseek(arch, c, need, refuse))
    return from_dict(ModelConfig, f, prefix=f"{where}: ")


def _rope(arch: str, c: dict, refuse) -> dict:
    params = c.get("rope_parameters") or {}
    if arch == "gemma3_text" and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    scaling = c.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    theta = c.get("rope_theta") or params.get("rope_theta") or 10000.0
    if not scaling:
        return {"rope_theta": float(theta)}
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind == "default":
        return {"rope_theta": float(theta)}
    if kind != "linear" or arch.startswith("deepseek"):
        refuse("rope_scaling", f"groundup implements linear RoPE scaling (and static NTK), not {kind!r}")
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool):
        refuse("rope_scaling", "linear RoPE scaling needs a numeric 'factor'")
    return {"rope_theta": float(theta), "rope_scaling": "linear", "rope_scaling_factor": float(factor)}


def _check_full_attention(arch: str, c: dict, refuse) -> None:
    """groundup attends to the whole context: a window narrower than it is a different model."""
    window, context = c.get("sliding_window"), c.get("max_position_embeddings")
    windowed = window is not None and window < context
    if arch in ("qwen2", "qwen3", "qwen3_moe"):
        windowed = windowed and bool(c.get("use_sliding_window"))
    if arch in ("gemma2", "gemma3_text"):
        # Gemma alternates local and global layers; without layer_types, its even layers are local.
        local = "sliding_attention" in (c.get("layer_types") or ["sliding_attention"])
        windowed = windowed and local
    if windowed:
        refuse("sliding_window", "groundup has no sliding-window attention")


def _qwen3_moe(c: dict, need, refuse) -> dict:
    dense = list(c.get("mlp_only_layers") or [])
    if dense != list(range(len(dense))):
        refuse("mlp_only_layers", "groundup keeps only the first layers dense")
    if c.get("decoder_sparse_step", 1) != 1:
        refuse("decoder_sparse_step", "groundup routes every layer after the leading dense ones")
    experts = c.get("num_experts") or need("num_local_experts")
    return dict(n_experts=experts, moe_top_k=need("num_experts_per_tok"), moe_d_ff=need("moe_intermediate_size"),
                moe_norm_topk=bool(c.get("norm_topk_prob", False)), n_dense_layers=len(dense),
                moe_bias_update_rate=0.0)


def _deepseek(arch: str, c: dict, need, refuse) -> dict:
    if c.get("rms_norm_eps", MLA_NORM_EPS) != MLA_NORM_EPS:
        refuse("rms_norm_eps", f"groundup uses one eps for every norm, and transformers' MLA latents use {MLA_NORM_EPS}")
    f = dict(attention="mla", n_kv_heads=None, q_lora_rank=c.get("q_lora_rank") or 0, kv_lora_rank=need("kv_lora_rank"),
             qk_nope_head_dim=need("qk_nope_head_dim"), qk_rope_head_dim=need("qk_rope_head_dim"),
             v_head_dim=need("v_head_dim"))
    experts = c.get("n_routed_experts") or 0
    first_dense = c.get("first_k_dense_replace") or 0
    if not experts or first_dense >= c["num_hidden_layers"]:
        return f
    if c.get("routed_scaling_factor", 1.0) != 1.0:
        refuse("routed_scaling_factor", "groundup does not scale the routing weights")
    if arch == "deepseek_v2" and c.get("topk_method", "greedy") != "greedy":
        refuse("topk_method", "groundup routes greedily over all experts")
    if arch == "deepseek_v3" and (c.get("n_group") or 1) > 1 and (c.get("topk_group") or 1) < c["n_group"]:
        refuse("topk_group", "groundup does not limit routing to groups of experts")
    f.update(n_experts=experts, moe_top_k=need("num_experts_per_tok"), moe_d_ff=need("moe_intermediate_size"),
             n_shared_experts=c.get("n_shared_experts") or 0, n_dense_layers=first_dense)
    if arch == "deepseek_v2":  # transformers' V2 router never renormalises, whatever norm_topk_prob says
        f.update(moe_router="softmax", moe_norm_topk=False, moe_bias_update_rate=0.0)
    else:
        f.update(moe_router="sigmoid", moe_norm_topk=bool(c.get("norm_topk_prob", True)))
    return f


# Every key parse_hf_config reads, with the JSON type it must have: valid JSON of another type (a
# rope_theta list, a sliding_window string, tie_word_embeddings "false") is one DataError naming the file
# and key, never a traceback or a string read as true. null is accepted where transformers writes it.
_INT, _NUM, _FLAG, _TEXT = (int, None), (float, None), (bool, None), (str, None)
_ROPE = {"rope_theta?": _NUM, "rope_type?": _TEXT, "type?": _TEXT, "factor?": _NUM}
_ROPE_PARAMETERS = {**_ROPE, "full_attention?": (_ROPE, None), "sliding_attention?": (_ROPE, None)}  # gemma3's
_SHAPE = {"model_type?": str, "rope_scaling?": (dict, None), "rope_parameters?": (dict, None),
          "num_hidden_layers?": int, "hidden_size?": int, "num_attention_heads?": int, "vocab_size?": int,
          "intermediate_size?": int, "max_position_embeddings?": int, "layer_types?": ([str], None),
          "mlp_only_layers?": ([int], None), "_name_or_path?": _TEXT, "hidden_act?": _TEXT,
          "hidden_activation?": _TEXT, "num_key_value_heads?": _INT, "rms_norm_eps?": _NUM,
          "tie_word_embeddings?": _FLAG, "initializer_range?": _NUM, "head_dim?": _INT, "rope_theta?": _NUM,
          "sliding_window?": _INT, "use_sliding_window?": _FLAG, "attention_bias?": _FLAG, "mlp_bias?": _FLAG,
          "query_pre_attn_scalar?": _NUM, "attn_logit_softcapping?": _NUM, "final_logit_softcapping?": _NUM,
          "num_local_experts?": _INT, "num_experts?": _INT, "num_experts_per_tok?": _INT,
          "moe_intermediate_size?": _INT, "decoder_sparse_step?": _INT, "norm_topk_prob?": _FLAG,
          "q_lora_rank?": _INT, "kv_lora_rank?": _INT, "qk_nope_head_dim?": _INT, "qk_rope_head_dim?": _INT,
          "v_head_dim?": _INT, "n_routed_experts?": _INT, "first_k_dense_replace?": _INT, "n_shared_experts?": _INT,
          "routed_scaling_factor?": _NUM, "topk_method?": _TEXT, "n_group?": _INT, "topk_group?": _INT}


def model_config_from_hf(c: dict, where: str = "config.json") -> tuple[str, ModelConfig]:
    """(arch, ModelConfig) of a Hugging Face config.json; ConfigError names what groundup cannot express.

    A config this module wrote carries the original ModelConfig; it is used when it still exports to
    the same config.json (so a round trip is exact, training-only fields included)."""
    check(c, _SHAPE, where)
    for key, shape in (("rope_scaling", _ROPE), ("rope_parameters", _ROPE_PARAMETERS)):
        if c.get(key) is not None:  # checked apart: the message then names the key inside
            check(c[key], shape, where, key)
    arch = c.get("model_type")
    if arch == "mistral":  # Llama's architecture with an optional sliding window
        arch = "llama"
    if arch not in CLASSES:
        raise ConfigError(f"{where}: model_type {c.get('model_type')!r} is not importable; supported: "
                          f"{', '.join(sorted(CLASSES))} (and mistral)", key="model_type")
    embedded = c.get(GROUNDUP_KEY)
    if isinstance(embedded, dict):
        try:
            cfg = from_dict(ModelConfig, dict(embedded))
            ids = {"bos": c.get("bos_token_id"), "eot": c.get("eos_token_id"), "pad": c.get("pad_token_id")}
            again = hf_config(arch, cfg, ids, c.get("torch_dtype", "float32"))
            if all(again.get(k) == v for k, v in c.items() if k not in ("transformers_version", "dtype")):
                return arch, cfg
        except (ConfigError, KeyError, TypeError):
            pass  # edited or foreign: read the architecture fields instead
    return arch, parse_hf_config(arch, c, where)
