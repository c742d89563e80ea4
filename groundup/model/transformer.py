"""The decoder-only transformer, read top to bottom.

    tokens -> embedding (* sqrt(d) if embed_scale)
           -> n_layers x Block: attention (GQA or MLA) and MLP (dense or MoE), each with a
              residual connection and normalisation before (pre), after (post) or both (sandwich)
           -> final norm -> output projection (tied to the embedding or not) -> logits

`forward(tokens, targets=None, head=None, *, cache, pad_lens, segments)` runs the trunk, then a head
on the final hidden state (heads.py): with targets by default the mean cross-entropy (plus z-loss and
the MoE balancing loss) through the fused chunked loss, without targets the logits; the scoring heads
give token log-probabilities, token statistics or a reward. With a KVCache it decodes incrementally.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from groundup.model.attention import Attention, AttnMask, build_mask
from groundup.model.config import ModelConfig
from groundup.model.kv_cache import KVCache
from groundup.model.heads import Logits, NextTokenLoss
from groundup.model.mla import MLAttention
from groundup.model.mlp import MLP
from groundup.model.moe import MoE
from groundup.model.norm import RMSNorm, make_norm
from groundup.model.rope import rope_tables


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.placement = cfg.norm_placement
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.attn = MLAttention(cfg) if cfg.attention == "mla" else Attention(cfg)
        self.mlp_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.mlp = MoE(cfg) if cfg.is_moe_layer(layer) else MLP(cfg.d_model, cfg.ffn_dim, cfg.mlp, cfg.bias)
        if self.placement == "sandwich":  # Gemma 2: also normalise each sub-layer's output
            self.attn_post_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
            self.mlp_post_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout else nn.Identity()

    def _mlp(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.mlp(x)
        return out if isinstance(out, tuple) else (out, None)

    def forward(self, x, cos, sin, mask: AttnMask, cache=None, last_only: bool = False):
        """`last_only`: every position's keys and values, the output of the last position alone (a
        prefill's last layer: attention's queries, its output projection and the MLP run on one row)."""
        if self.placement == "post":  # original Transformer: normalise after the residual add
            a = self.attn(x, cos, sin, mask, cache, last_only=last_only)
            x = self.attn_norm((x[:, -1:] if last_only else x) + self.dropout(a))
            h, aux = self._mlp(x)
            return self.mlp_norm(x + self.dropout(h)), aux
        a = self.attn(self.attn_norm(x), cos, sin, mask, cache, last_only=last_only)
        if self.placement == "sandwich":
            a = self.attn_post_norm(a)
        x = (x[:, -1:] if last_only else x) + self.dropout(a)
        h, aux = self._mlp(self.mlp_norm(x))
        if self.placement == "sandwich":
            h = self.mlp_post_norm(h)
        return x + self.dropout(h), aux


class Transformer(nn.Module):
    # The module types this model's linear layers are (LoRA wraps these; a quantized model adds its own).
    linear_types: tuple[type[nn.Module], ...] = (nn.Linear,)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias) if cfg.norm_placement != "post" else None
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.value_head = nn.Linear(cfg.d_model, 1) if cfg.value_head else None  # reward models
        self.grad_checkpointing = False
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.reset_buffers()
        self.init_weights()

    # ------------------------------------------------------------------ setup

    @property
    def device(self) -> torch.device:
        return self.rope_cos.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype activations run in: the norms' (a quantized embedding table is not read for it)."""
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def reset_buffers(self) -> None:
        """(Re)compute the RoPE tables; needed after building on the meta device."""
        cfg = self.cfg
        rope_dim = cfg.qk_rope_head_dim if cfg.attention == "mla" else cfg.attn_head_dim
        device = self.embed.weight.device
        cos, sin = rope_tables(rope_dim, cfg.max_seq_len, cfg.rope_theta, cfg.rope_scaling,
                               cfg.rope_scaling_factor, device=None if device.type == "meta" else device)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)
        for moe in self.moe_layers():
            moe.load = torch.zeros(moe.n_experts, device=device)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Every parameter and persistent buffer, so a model materialised from the meta device with
        `to_empty()` (FSDP's meta initialisation) holds no uninitialised memory."""
        cfg = self.cfg
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        for module in self.modules():
            params = []
            if isinstance(module, (nn.Linear, nn.Embedding)):
                params = [module.weight]
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, (RMSNorm, nn.LayerNorm)):
                module.weight.fill_(1.0)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, MoE):
                params = [module.experts_in, module.experts_out]
                module.expert_bias.zero_()
            for p in params:
                owner = module if isinstance(module, (nn.Linear, nn.Embedding)) else p
                std = residual_std if getattr(owner, "is_residual_proj", False) else cfg.init_std
                _init_tensor(p, cfg.init, std)

    def to_float(self) -> "Transformer":
        """This model with every layer in floating point: already so here; a quantized model dequantizes."""
        return self

    def moe_layers(self) -> list[MoE]:
        return [m for m in self.modules() if isinstance(m, MoE)]

    # ------------------------------------------------------------------ forward

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None, head=None, *,
                cache: KVCache | None = None, pad_lens: torch.Tensor | None = None,
                segments: torch.Tensor | None = None):
        """The trunk on `tokens` (B, T), then `head` (heads.py) on the final hidden state; its result type is
        the head's. Default head: NextTokenLoss() with `targets`, Logits() without.

        `cache`: a KVCache; decoding continues from the positions it holds (its rows' left padding
        included). `pad_lens` (B,): left padding per row without a cache (position 0 is each row's first
        real token). `segments` (B, T): packed examples (fine-tuning); a token attends only within its
        segment and RoPE positions restart at each segment's first token, so each example sees only itself."""
        if head is None:
            head = NextTokenLoss() if targets is not None else Logits()
        last_only = getattr(head, "last_only", False)  # any callable head(model, x, targets, aux) is a head
        B, T = tokens.shape
        cfg = self.cfg
        start = cache.prepare(T) if cache is not None else 0
        if cache is not None:
            pad_lens = cache.pad_lens
        if start + T > cfg.max_seq_len:
            raise ValueError(f"sequence of {start + T} positions exceeds max_seq_len {cfg.max_seq_len}")
        x = self.embed(tokens)
        if cfg.embed_scale:
            x = x * math.sqrt(cfg.d_model)
        if segments is not None:
            pos = segment_positions(segments)
            cos, sin = self.rope_cos[pos].unsqueeze(1), self.rope_sin[pos].unsqueeze(1)
        elif pad_lens is None:
            cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]
        else:  # left-padded rows: position 0 is each row's first real token
            pos = (torch.arange(start, start + T, device=tokens.device)[None] - pad_lens[:, None]).clamp_min(0)
            cos, sin = self.rope_cos[pos].unsqueeze(1), self.rope_sin[pos].unsqueeze(1)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        if segments is not None:
            same = segments[:, :, None] == segments[:, None, :]
            mask = AttnMask(causal=False, mask=(same & torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril())[:, None])
        else:
            mask = cache.attn_mask(T) if cache is not None else build_mask(T, start, pad_lens, tokens.device)
        aux_total = None
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            if self.grad_checkpointing and self.training:
                x, aux = checkpoint(block, x, cos, sin, mask, layer_cache, use_reentrant=False)
            else:  # last_only: the last layer's queries and MLP run on the last position alone
                x, aux = block(x, cos, sin, mask, layer_cache, last_only=last_only and i == last)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
        if cache is not None:
            cache.advance(T)
        if last_only:
            x = x[:, -1:]
        if self.norm is not None:
            x = self.norm(x)
        return head(self, x, targets, aux_total)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The output layer on hidden states: float32 logits, soft-capped as the config says."""
        logits = F.linear(x, self.output_weight).float()
        cap = self.cfg.final_logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits


def segment_positions(segments: torch.Tensor) -> torch.Tensor:
    """(B, T) position of each token within its segment (segments are runs of equal ids)."""
    B, T = segments.shape
    idx = torch.arange(T, device=segments.device).expand(B, T)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first


def _init_tensor(p: torch.Tensor, scheme: str, std: float) -> None:
    if p.dim() == 3:  # stacked experts (E, out, in): fan-in/fan-out are per expert
        for expert in p:
            _init_tensor(expert, scheme, std)
        return
    if scheme == "normal":
        nn.init.normal_(p, 0.0, std)
    elif scheme == "trunc_normal":
        nn.init.trunc_normal_(p, 0.0, std, a=-3 * std, b=3 * std)
    elif scheme == "xavier":
        nn.init.xavier_uniform_(p)
    elif scheme == "kaiming":
        nn.init.kaiming_normal_(p, nonlinearity="linear")
    elif scheme == "lecun":
        fan_in = p.shape[-1]
        nn.init.normal_(p, 0.0, 1.0 / math.sqrt(fan_in))
    else:
        raise ValueError(f"unknown init scheme {scheme!r}")
