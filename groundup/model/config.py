"""The model's configuration: every architectural choice in one typed, validated dataclass.

A TOML `[model]` table overrides the defaults; `preset = "ladder-100m"` starts from a named preset
(see presets.py) and the other keys override it. `validate()` rejects impossible combinations
before any tensor is allocated, naming the key, the value and what is expected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from groundup.config import ConfigError, did_you_mean, fail
from groundup.model.presets import PRESETS


# Sane upper bounds, checked before anything is allocated (the largest open models are well inside them).
SIZE_LIMITS = {"vocab_size": 1 << 24, "d_model": 1 << 17, "n_layers": 4096, "n_heads": 4096, "n_kv_heads": 4096,
               "head_dim": 1 << 14, "max_seq_len": 1 << 23, "d_ff": 1 << 20, "moe_d_ff": 1 << 20, "n_experts": 4096,
               "kv_lora_rank": 1 << 16, "q_lora_rank": 1 << 16, "qk_nope_head_dim": 1 << 14,
               "qk_rope_head_dim": 1 << 14, "v_head_dim": 1 << 14, "ffn_multiple_of": 1 << 16}
MAX_PARAMS = 1e13


@dataclass
class ModelConfig:
    name: str = "custom"  # a label for reports and messages; a preset sets it to its own name
    vocab_size: int = 32768  # token ids the embedding and output layer cover
    d_model: int = 768  # hidden (residual stream) width
    n_layers: int = 12  # transformer blocks
    n_heads: int = 12  # query (attention) heads
    n_kv_heads: int | None = None  # None: = n_heads (MHA); 1: MQA; in between: GQA
    head_dim: int | None = None  # None: d_model // n_heads
    max_seq_len: int = 2048  # longest sequence in tokens (RoPE tables and KV cache cover it)

    # Attention
    attention: Literal["gqa", "mla"] = "gqa"  # "gqa" covers MHA/GQA/MQA through n_kv_heads
    rope_theta: float = 10000.0  # RoPE base (theta): larger = slower-rotating position frequencies
    rope_scaling: Literal["none", "linear", "ntk"] = "none"  # for contexts longer than trained on
    rope_scaling_factor: float = 1.0  # context-extension factor for rope_scaling; 1 = no change
    qk_norm: bool = False  # RMSNorm on q and k per head (OLMo 2, Qwen3)
    attn_logit_softcap: float = 0.0  # 0 = off; Gemma 2 uses 50
    # Multi-head latent attention (DeepSeek-V2); used when attention = "mla"
    q_lora_rank: int = 0  # 0: queries are projected directly (V2-Lite)
    kv_lora_rank: int = 512  # the compressed latent the KV cache stores
    qk_nope_head_dim: int = 128  # MLA: per-head query/key dimension that gets no RoPE
    qk_rope_head_dim: int = 64  # the decoupled RoPE key, shared by all heads
    v_head_dim: int = 128  # MLA: per-head value dimension

    # Feed-forward
    mlp: Literal["swiglu", "geglu", "gelu", "relu2"] = "swiglu"  # MLP and expert activation; swiglu, geglu: gated
    d_ff: int | None = None  # None: 8/3*d (gated) or 4*d, rounded up to ffn_multiple_of
    ffn_multiple_of: int = 256  # the derived d_ff is rounded up to a multiple of this
    # Mixture of experts; n_experts = 0 is a dense model
    n_experts: int = 0  # routed experts per MoE layer; 0 = dense
    moe_top_k: int = 2  # routed experts each token is sent to
    n_shared_experts: int = 0  # always-active experts each token also passes through; 0 = none
    moe_d_ff: int | None = None  # None: the dense d_ff
    n_dense_layers: int = 0  # the first k layers stay dense (DeepSeek keeps layer 0 dense)
    moe_router: Literal["softmax", "sigmoid"] = "softmax"  # sigmoid: DeepSeek-V3
    moe_norm_topk: bool = True  # renormalise the top-k gate weights to sum to 1
    moe_aux_loss_coef: float = 0.0  # Switch-style load-balancing loss; 0 = off
    moe_bias_update_rate: float = 1e-3  # auxiliary-loss-free balancing (DeepSeek-V3); 0 = off

    # Normalisation
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"  # normalisation layer type
    norm_eps: float = 1e-5  # small constant in the norms' denominator, for numerical stability
    norm_placement: Literal["pre", "post", "sandwich"] = "pre"  # sandwich: Gemma 2

    # Embeddings and output
    tie_embeddings: bool = False  # the output layer reuses the input embedding matrix
    embed_scale: bool = False  # multiply embeddings by sqrt(d_model) (Gemma)
    final_logit_softcap: float = 0.0  # 0 = off; Gemma 2 uses 30
    bias: bool = False  # biases in linear layers and LayerNorm (GPT-2)
    qkv_bias: bool = False  # biases on the q, k and v projections only (Qwen2/2.5); implied by bias
    dropout: float = 0.0  # on attention weights and residual branches while training; 0 = off
    value_head: bool = False  # a reward model: a scalar head on the last token's final hidden state

    # Initialisation: "normal" = N(0, init_std) with residual projections scaled by
    # 1/sqrt(2*n_layers) (GPT-2); the others are the torch.nn.init schemes of the same names.
    init: Literal["normal", "trunc_normal", "xavier", "kaiming", "lecun"] = "normal"
    init_std: float = 0.02  # standard deviation of the normal and trunc_normal inits

    # Loss
    z_loss_coef: float = 0.0  # PaLM uses 1e-4 on log(Z)^2
    loss_chunk_size: int = 2048  # rows per chunk of the fused output-layer + loss; 0 = plain

    # ------------------------------------------------------------------ derived sizes

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def gated(self) -> bool:
        return self.mlp in ("swiglu", "geglu")

    @property
    def ffn_dim(self) -> int:
        if self.d_ff:
            return self.d_ff
        hidden = 8 * self.d_model / 3 if self.gated else 4 * self.d_model
        m = self.ffn_multiple_of
        return m * math.ceil(hidden / m)

    @property
    def expert_ffn_dim(self) -> int:
        return self.moe_d_ff or self.ffn_dim

    def approx_params(self) -> float:
        """Parameters counted from the config alone (no module is built): embeddings, attention, MLPs."""
        d, hd = self.d_model, self.head_dim or max(1, self.d_model // max(1, self.n_heads))
        embed = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        attn = d * hd * (2 * self.n_heads + 2 * (self.n_kv_heads or self.n_heads))
        mlp = (3 if self.gated else 2) * d * self.ffn_dim
        experts = self.n_experts * 3 * d * (self.moe_d_ff or self.ffn_dim) + self.n_experts * d
        layer_moe = max(0, self.n_layers - self.n_dense_layers) if self.n_experts else 0
        return float(embed + self.n_layers * attn + (self.n_layers - layer_moe) * mlp + layer_moe * experts)

    def is_moe_layer(self, layer: int) -> bool:
        return self.n_experts > 0 and layer >= self.n_dense_layers

    # ------------------------------------------------------------------ config protocol

    @classmethod
    def preprocess(cls, data: dict, prefix: str = "") -> dict:
        """Expand `preset = NAME` into the preset's values; explicit keys override them."""
        if "preset" not in data:
            return data

        name = data.pop("preset")
        if name not in PRESETS:
            hint = did_you_mean(name, PRESETS)
            raise ConfigError(f"{prefix}preset = {name!r}: unknown preset{hint}; known: {', '.join(PRESETS)}",
                              key=prefix + "preset")
        return {**PRESETS[name], "name": name, **data}

    def validate(self) -> None:
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "ffn_multiple_of"):
            if getattr(self, key) <= 0:
                fail(key, getattr(self, key), "a positive integer")
        # Sizes are bounded before anything is built: a typo such as n_layers = 1e9 must fail in a
        # millisecond with the size in the message, not hang building modules or exhaust memory.
        for key, limit in SIZE_LIMITS.items():
            value = getattr(self, key)
            if value is not None and value > limit:
                fail(key, value, f"at most {limit:,}")
        params = self.approx_params()
        if params > MAX_PARAMS:
            raise ConfigError(f"this model would have about {params:.3g} parameters ({params * 2 / 1e12:.3g} TB in "
                              f"bf16), more than groundup builds ({MAX_PARAMS:.0e}); check d_model, n_layers, "
                              "d_ff, n_experts and vocab_size", key="n_layers")
        if self.n_kv_heads is not None and not 1 <= self.n_kv_heads <= self.n_heads:
            fail("n_kv_heads", self.n_kv_heads, f"between 1 and n_heads ({self.n_heads})")
        if self.n_heads % self.kv_heads:
            fail("n_kv_heads", self.n_kv_heads, f"a divisor of n_heads ({self.n_heads})")
        if self.attention == "gqa":
            if self.head_dim is None and self.d_model % self.n_heads:
                fail("n_heads", self.n_heads, f"a divisor of d_model ({self.d_model}), or set head_dim")
            if self.attn_head_dim % 2:
                fail("head_dim" if self.head_dim else "n_heads", self.head_dim or self.n_heads,
                     f"an even head dimension for RoPE (d_model / n_heads = {self.attn_head_dim})")
        else:
            for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, key) <= 0:
                    fail(key, getattr(self, key), "a positive integer for attention = 'mla'")
            if self.qk_rope_head_dim % 2:
                fail("qk_rope_head_dim", self.qk_rope_head_dim, "an even number (RoPE rotates pairs)")
            if self.q_lora_rank < 0:
                fail("q_lora_rank", self.q_lora_rank, "0 (no query compression) or a positive rank")
            if self.qk_norm:
                fail("qk_norm", True, "false with attention = 'mla' (MLA normalises its latents instead)")
            if self.qkv_bias:
                fail("qkv_bias", True, "false with attention = 'mla' (it has no q, k, v projections to bias)")
        if self.rope_scaling_factor < 1:
            fail("rope_scaling_factor", self.rope_scaling_factor, "a number >= 1")
        for key in ("attn_logit_softcap", "final_logit_softcap", "z_loss_coef", "moe_aux_loss_coef",
                    "moe_bias_update_rate", "norm_eps", "init_std"):
            if getattr(self, key) < 0:
                fail(key, getattr(self, key), "a number >= 0")
        if not 0 <= self.dropout < 1:
            fail("dropout", self.dropout, "a number in [0, 1)")
        if self.d_ff is not None and self.d_ff <= 0:
            fail("d_ff", self.d_ff, "a positive integer")
        if self.loss_chunk_size < 0:
            fail("loss_chunk_size", self.loss_chunk_size, "0 (plain loss) or a positive chunk size")
        if self.n_experts:
            if self.n_experts < 2:
                fail("n_experts", self.n_experts, "0 (dense) or at least 2")
            if not 1 <= self.moe_top_k <= self.n_experts:
                fail("moe_top_k", self.moe_top_k, f"between 1 and n_experts ({self.n_experts})")
            if not 0 <= self.n_dense_layers <= self.n_layers:
                fail("n_dense_layers", self.n_dense_layers, f"between 0 and n_layers ({self.n_layers})")
            if self.moe_d_ff is not None and self.moe_d_ff <= 0:
                fail("moe_d_ff", self.moe_d_ff, "a positive integer")
        elif self.n_shared_experts:
            fail("n_shared_experts", self.n_shared_experts, "0 when n_experts = 0 (a dense model)")
