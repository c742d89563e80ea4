"""Tensor names and layouts between groundup and Hugging Face, as one table read both ways.

Each `Rule` ties some groundup tensors to some Hugging Face tensors with a transform and its exact
inverse, so export and import cannot drift apart and a round trip returns the same bits:

- fused projections are split: `qkv_proj` -> q/k/v_proj, `gate_up_proj` -> gate_proj/up_proj (gate
  first). Our RoPE already uses the rotate-half layout transformers uses, so nothing is permuted...
- ...except for DeepSeek, whose checkpoints store each RoPE slice interleaved (x0, x1 form a pair);
  those rows are permuted, which leaves every dot product, hence every output, unchanged.
- stacked experts (E, 2F, d) become one gate/up/down projection per expert.
- Gemma stores its RMSNorm weights as an offset from 1 (it computes x * (1 + w)).
- a selection bias that an architecture lacks must be zero; it is re-created as zeros on import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from groundup.errors import CheckpointError
from groundup.model.config import ModelConfig

Tensors = list[torch.Tensor]


@dataclass
class Rule:
    ours: tuple[str, ...]
    hf: tuple[str, ...]
    to_hf: Callable[[Tensors], Tensors] = lambda t: t
    from_hf: Callable[[Tensors], Tensors] = lambda t: t


def _split(ours: str, hf: tuple[str, ...], sizes: list[int]) -> Rule:
    return Rule((ours,), hf, lambda t: list(t[0].split(sizes)), lambda t: [torch.cat(t)])


def _offset(ours: str, hf: str) -> Rule:  # Gemma: x * (1 + w)
    return Rule((ours,), (hf,), lambda t: [t[0] - 1], lambda t: [t[0] + 1])


def _rows(ours: str, hf: str, perm: torch.Tensor) -> Rule:
    inverse = torch.argsort(perm)
    return Rule((ours,), (hf,), lambda t: [t[0][perm]], lambda t: [t[0][inverse]])


def _zero_buffer(ours: str, size: int) -> Rule:
    """A groundup buffer the architecture lacks: exported only if zero (checked before), imported as zeros."""
    return Rule((ours,), (), lambda t: [], lambda t: [torch.zeros(size)])


def _empty_mlp(hf: str, d: int) -> Rule:
    """DeepSeek always builds a shared expert; with none, its weights are empty (and add nothing)."""
    keys = (hf + "gate_proj.weight", hf + "up_proj.weight", hf + "down_proj.weight")
    return Rule((), keys, lambda t: [torch.zeros(0, d), torch.zeros(0, d), torch.zeros(d, 0)], lambda t: [])


def _experts(ours_in: str, ours_out: str, hf: Callable[[int, str], str], n: int, ffn: int, names: tuple[str, str, str]) -> Rule:
    gate, up, down = names
    keys = tuple(hf(e, p) for e in range(n) for p in (gate, up, down))

    def to_hf(t: Tensors) -> Tensors:
        return [x for e in range(n) for x in (*t[0][e].split(ffn), t[1][e])]

    def from_hf(t: Tensors) -> Tensors:
        return [torch.stack([torch.cat(t[3 * e : 3 * e + 2]) for e in range(n)]), torch.stack(t[2::3])]

    return Rule((ours_in, ours_out), keys, to_hf, from_hf)


def interleave_rope(rope: int) -> torch.Tensor:
    """Row order that stores a rotate-half RoPE slice as DeepSeek's interleaved pairs."""
    half = rope // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)


def rules(arch: str, cfg: ModelConfig) -> list[Rule]:
    bias = cfg.bias
    gemma = arch in ("gemma2", "gemma3_text")
    norm = _offset if gemma else lambda ours, hf: Rule((ours,), (hf,))
    out = [Rule(("embed.weight",), ("model.embed_tokens.weight",)), norm("norm.weight", "model.norm.weight")]
    if not cfg.tie_embeddings:
        out.append(Rule(("lm_head.weight",), ("lm_head.weight",)))
    for i in range(cfg.n_layers):
        ours, hf = f"blocks.{i}.", f"model.layers.{i}."
        out += [norm(ours + "attn_norm.weight", hf + "input_layernorm.weight")]
        if gemma:
            out += [norm(ours + "attn_post_norm.weight", hf + "post_attention_layernorm.weight"),
                    norm(ours + "mlp_norm.weight", hf + "pre_feedforward_layernorm.weight"),
                    norm(ours + "mlp_post_norm.weight", hf + "post_feedforward_layernorm.weight")]
        else:
            out.append(norm(ours + "mlp_norm.weight", hf + "post_attention_layernorm.weight"))
        out += _mla(ours, hf, cfg, arch) if cfg.attention == "mla" else _gqa(ours, hf, cfg, bias, norm)
        out += _mlp(ours, hf, cfg, arch, i, bias)
    return out


def _gqa(ours: str, hf: str, cfg: ModelConfig, bias: bool, norm) -> list[Rule]:
    a, h = ours + "attn.", hf + "self_attn."
    d = cfg.attn_head_dim
    sizes = [cfg.n_heads * d, cfg.kv_heads * d, cfg.kv_heads * d]
    out = [_split(a + "qkv_proj.weight", (h + "q_proj.weight", h + "k_proj.weight", h + "v_proj.weight"), sizes),
           Rule((a + "o_proj.weight",), (h + "o_proj.weight",))]
    if bias or cfg.qkv_bias:  # Qwen2 biases q, k and v only
        out.append(_split(a + "qkv_proj.bias", (h + "q_proj.bias", h + "k_proj.bias", h + "v_proj.bias"), sizes))
    if bias:
        out.append(Rule((a + "o_proj.bias",), (h + "o_proj.bias",)))
    if cfg.qk_norm:
        out += [norm(a + "q_norm.weight", h + "q_norm.weight"), norm(a + "k_norm.weight", h + "k_norm.weight")]
    return out


def _mla(ours: str, hf: str, cfg: ModelConfig, arch: str) -> list[Rule]:
    a, h = ours + "attn.", hf + "self_attn."
    nope, rope, rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    interleave = interleave_rope(rope)
    head = torch.cat([torch.arange(nope), nope + interleave])  # one query head: [nope | rope]
    q_rows = torch.cat([head + k * (nope + rope) for k in range(cfg.n_heads)])
    kv_rows = torch.cat([torch.arange(rank), rank + interleave])
    out = [_rows(a + "kv_down.weight", h + "kv_a_proj_with_mqa.weight", kv_rows),
           Rule((a + "kv_norm.weight",), (h + "kv_a_layernorm.weight",)),
           Rule((a + "kv_up.weight",), (h + "kv_b_proj.weight",)),
           Rule((a + "o_proj.weight",), (h + "o_proj.weight",))]
    if cfg.q_lora_rank:
        out += [Rule((a + "q_down.weight",), (h + "q_a_proj.weight",)),
                Rule((a + "q_norm.weight",), (h + "q_a_layernorm.weight",)),
                _rows(a + "q_up.weight", h + "q_b_proj.weight", q_rows)]
    else:
        out.append(_rows(a + "q_proj.weight", h + "q_proj.weight", q_rows))
    return out


def _dense(ours: str, hf: str, ffn: int, bias: bool) -> list[Rule]:
    out = [_split(ours + "gate_up_proj.weight", (hf + "gate_proj.weight", hf + "up_proj.weight"), [ffn, ffn]),
           Rule((ours + "down_proj.weight",), (hf + "down_proj.weight",))]
    if bias:
        out += [_split(ours + "gate_up_proj.bias", (hf + "gate_proj.bias", hf + "up_proj.bias"), [ffn, ffn]),
                Rule((ours + "down_proj.bias",), (hf + "down_proj.bias",))]
    return out


def _mlp(ours: str, hf: str, cfg: ModelConfig, arch: str, layer: int, bias: bool) -> list[Rule]:
    m = ours + "mlp."
    if not cfg.is_moe_layer(layer):
        return _dense(m, hf + "mlp.", cfg.ffn_dim, bias)
    E, f = cfg.n_experts, cfg.expert_ffn_dim
    mixtral = arch == "mixtral"  # Mixtral's own names: block_sparse_moe, w1 (gate), w3 (up), w2 (down)
    moe = hf + ("block_sparse_moe." if mixtral else "mlp.")
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = [Rule((m + "router.weight",), (moe + "gate.weight",)),
           _experts(m + "experts_in", m + "experts_out", lambda e, p: f"{moe}experts.{e}.{p}.weight", E, f, names)]
    if arch == "deepseek_v3":
        out.append(Rule((m + "expert_bias",), (moe + "gate.e_score_correction_bias",)))
    else:
        out.append(_zero_buffer(m + "expert_bias", E))
    if cfg.n_shared_experts:
        out += _dense(m + "shared.", moe + "shared_experts.", f * cfg.n_shared_experts, False)
    elif arch.startswith("deepseek"):
        out.append(_empty_mlp(moe + "shared_experts.", cfg.d_model))
    return out


# ---------------------------------------------------------------------------- applying the table


def to_hf_state(arch: str, cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    table = rules(arch, cfg)
    used = {k for r in table for k in r.ours}
    missing = sorted(used - state.keys())
    extra = sorted(state.keys() - used)
    if missing or extra:  # a bug in the table, not a user error: say exactly what
        raise RuntimeError(f"export table for {arch} does not match the model: missing {missing}, unused {extra}")
    out = {}
    for r in table:
        tensors = r.to_hf([state[k] for k in r.ours])
        # A copy per tensor: split views share storage, which safetensors refuses to write.
        out.update({name: t.clone(memory_format=torch.contiguous_format) for name, t in zip(r.hf, tensors)})
    return out


def from_hf_state(arch: str, cfg: ModelConfig, hf: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    table = rules(arch, cfg)
    wanted = {k for r in table for k in r.hf}
    # transformers ties lm_head to the embedding; a checkpoint may still carry a copy of it
    ignorable = {"lm_head.weight"} if cfg.tie_embeddings else set()
    missing = sorted(wanted - hf.keys())
    unexpected = sorted(k for k in hf.keys() - wanted - ignorable if not k.endswith("rotary_emb.inv_freq"))
    if missing or unexpected:
        show = lambda names: ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        parts = ([f"missing {show(missing)}"] if missing else []) + ([f"unexpected {show(unexpected)}"] if unexpected else [])
        raise CheckpointError(f"{where}: tensors do not match a {arch} model of this config.json: {'; '.join(parts)}")
    state = {}
    for r in table:
        tensors = r.from_hf([hf[k] for k in r.hf])
        state.update(zip(r.ours, tensors))
    return state
