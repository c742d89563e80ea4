"""LoRA: low-rank adapters on a frozen model, trained and saved on their own, merged when wanted.

    cfg = LoraConfig(rank=16, alpha=32, targets=["attention", "mlp"])
    apply_lora(model, cfg)           # wraps the targeted layers; only the adapters require grad
    adapter_state(model)             # {name: tensor} of the adapters alone (what a run saves)
    merge_lora(model)                # folds every adapter into its base weight, in place

A wrapped linear layer computes `base(x) + scale * B(A(dropout(x)))` with A (rank x in) drawn as
peft draws it and B (out x rank) zero, so before the first step the model is exactly the base model
(tested). `scale` is alpha / rank, or alpha / sqrt(rank) with rsLoRA. Our fused projections
(`qkv_proj`, `gate_up_proj`) carry one (A, B) pair per part (q, k, v; gate, up), which is exactly
peft's separate adapters on Hugging Face's q_proj/k_proj/v_proj and gate_proj/up_proj, so an adapter
exports to peft without approximation (interop/peft_format.py). Stacked MoE experts get one pair per
expert through a weight parametrization (W_e + scale * B_e A_e), without dropout.

QLoRA: the layer under an adapter may be a quantized one (groundup.quant's QuantLinear, int8 or int4):
it stays frozen and integer, the adapter trains in full precision, and the forward and backward pass
never hold a float copy of its weight beyond one layer at a time (quant/modules.py's QuantMatmul).
Merging such an adapter dequantizes: the layer becomes an nn.Linear holding dequantize(W) + BA, and
`merge_lora` turns the rest of the model to float too (`dequantize_model`), so the merged model is an
ordinary full-precision one (quantize it again with `groundup quantize`).

Targets: "attention" (GQA: qkv_proj, o_proj; MLA: q_proj or q_down/q_up, kv_down, kv_up, o_proj),
"mlp" (dense MLPs and shared experts: gate_up_proj or up_proj, down_proj), "experts" (routed MoE
experts), "all" (all three), or module names such as "o_proj". The router and the embeddings are
never adapted.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from groundup.config import fail
from groundup.errors import CheckpointError
from groundup.model.moe import MoE

GROUPS = {"attention": ("qkv_proj", "o_proj", "q_proj", "q_down", "q_up", "kv_down", "kv_up"),
          "mlp": ("gate_up_proj", "up_proj", "down_proj")}
TARGET_WORDS = ("attention", "mlp", "experts", "all")
LINEAR_NAMES = {name for names in GROUPS.values() for name in names}


@dataclass
class LoraConfig:
    rank: int = 0  # adapter rank; 0 = off (every weight trains)
    alpha: float = 16.0  # scale = alpha / rank (alpha / sqrt(rank) with rslora)
    dropout: float = 0.0  # dropout on the adapter's input (peft's lora_dropout)
    targets: list[str] = field(default_factory=lambda: ["attention", "mlp"])  # see the module docstring
    rslora: bool = False  # rank-stabilised scaling (Kalajdzievski 2023)

    def validate(self) -> None:
        if self.rank < 0:
            fail("rank", self.rank, "0 (off) or a positive rank")
        if not 0 <= self.dropout < 1:
            fail("dropout", self.dropout, "a number in [0, 1)")
        if self.rank and not self.targets:
            fail("targets", self.targets, "at least one of attention, mlp, experts, all, or a module name")
        for t in self.targets:
            if t not in TARGET_WORDS and t not in LINEAR_NAMES:
                fail("targets", t, f"one of {', '.join(TARGET_WORDS)} or a module name ({', '.join(sorted(LINEAR_NAMES))})")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)

    def module_names(self) -> set[str]:
        names: set[str] = set()
        for t in self.targets:
            if t == "all":
                names |= LINEAR_NAMES
            elif t in GROUPS:
                names |= set(GROUPS[t])
            elif t != "experts":
                names.add(t)
        return names

    def adapts_experts(self) -> bool:
        return "experts" in self.targets or "all" in self.targets


def _init_a(a: torch.Tensor) -> None:
    nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # peft's default ("init_lora_weights=True")


class LoRALinear(nn.Module):
    """A frozen linear layer (or anything with in/out features and a weight) plus a low-rank update.

    `parts`: output sizes of a fused projection; each part has its own A and B rows
    (lora_A stacks the parts' A matrices, lora_B the parts' B rows)."""

    def __init__(self, base: nn.Module, rank: int, scale: float, dropout: float = 0.0,
                 parts: list[int] | None = None):
        super().__init__()
        self.base = base
        self.rank, self.scale = rank, scale
        self.parts = list(parts or [base.out_features])
        if sum(self.parts) != base.out_features:
            raise ValueError(f"parts {self.parts} do not add up to {base.out_features} outputs")
        integers = getattr(base, "qweight", None)  # a quantized layer: its .weight would dequantize it
        device = (integers if integers is not None else base.weight).device
        self.lora_A = nn.Parameter(torch.empty(len(self.parts) * rank, base.in_features, device=device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=device))
        for a in self.lora_A.data.split(rank):
            _init_a(a)
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.merged = False
        self.disabled = False  # adapters_disabled(): the base alone (a reference model for free)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta(self) -> torch.Tensor:
        """The update to the base weight, (out x in): scale * block-diagonal B @ A."""
        rows = [b @ a for a, b in zip(self.lora_A.split(self.rank), self.lora_B.split(self.parts))]
        return torch.cat(rows) * self.scale

    @property
    def weight(self) -> torch.Tensor:
        """The effective weight (code that reads a projection's weight, e.g. MLA's absorbed decoding)."""
        w = self.base.weight
        return w if self.merged or self.disabled else w + self.delta().to(w.dtype)

    @property
    def bias(self):
        return getattr(self.base, "bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.merged or self.disabled:
            return y
        u = F.linear(self.dropout(x), self.lora_A.to(x.dtype))  # (..., parts * rank)
        if len(self.parts) == 1:
            return y + F.linear(u, self.lora_B.to(x.dtype)) * self.scale
        outs = [F.linear(ui, bi.to(x.dtype)) for ui, bi in zip(u.split(self.rank, dim=-1), self.lora_B.split(self.parts))]
        return y + torch.cat(outs, dim=-1) * self.scale

    @torch.no_grad()
    def merge(self) -> nn.Module:
        """The base layer with the update folded into its weight (this wrapper is then spent); a quantized
        base becomes an nn.Linear holding its dequantized weight plus the update."""
        base = self.base
        if not isinstance(base, nn.Linear):
            w = base.weight  # dequantized
            linear = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None, device=w.device,
                               dtype=w.dtype)
            linear.weight.copy_(w)
            if base.bias is not None:
                linear.bias.copy_(base.bias)
            base = linear
        base.weight += self.delta().to(base.weight.dtype)
        self.merged = True
        return base


class ExpertLoRA(nn.Module):
    """A parametrization of stacked expert weights (E, out, in): W_e + scale * B_e @ A_e."""

    def __init__(self, weight: torch.Tensor, rank: int, scale: float):
        super().__init__()
        E, out, inp = weight.shape
        self.rank, self.scale = rank, scale
        self.lora_A = nn.Parameter(torch.empty(E, rank, inp, device=weight.device))
        self.lora_B = nn.Parameter(torch.zeros(E, out, rank, device=weight.device))
        for a in self.lora_A.data:
            _init_a(a)
        self.disabled = False

    def delta(self) -> torch.Tensor:
        return torch.bmm(self.lora_B, self.lora_A) * self.scale

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight if self.disabled else weight + self.delta().to(weight.dtype)


def _fused_parts(module: nn.Module, name: str, model_cfg) -> list[int] | None:
    if name == "qkv_proj":
        hd = model_cfg.attn_head_dim
        return [model_cfg.n_heads * hd, model_cfg.kv_heads * hd, model_cfg.kv_heads * hd]
    if name == "gate_up_proj":
        half = module.out_features // 2
        return [half, half]
    return None


def apply_lora(model: nn.Module, cfg: LoraConfig) -> list[str]:
    """Wrap the targeted layers of a Transformer in place and freeze everything but the adapters.

    Returns the names of the adapted modules (experts as `...mlp.experts_in` / `experts_out`)."""
    if not cfg.enabled:
        return []
    # The layer types the model computes its linear layers with: nn.Linear, and a quantized model's
    # QuantLinear too (QLoRA: a quantized layer is wrapped like a float one).
    linear_types = model.linear_types
    wanted = cfg.module_names()
    for p in model.parameters():
        p.requires_grad_(False)
    adapted = []
    for path, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if (child_name in wanted and isinstance(child, linear_types)
                    and not isinstance(module, LoRALinear)):
                wrapped = LoRALinear(child, cfg.rank, cfg.scale, cfg.dropout, _fused_parts(child, child_name, model.cfg))
                setattr(module, child_name, wrapped)
                adapted.append(f"{path}.{child_name}" if path else child_name)
        if isinstance(module, MoE) and cfg.adapts_experts():
            if not isinstance(getattr(module, "experts_in", None), nn.Parameter):
                fail("targets", cfg.targets, "no 'experts' (or 'all') on a quantized MoE: its stacked experts are "
                     "integer weights, which take no adapter; adapt attention and mlp")
            for pname in ("experts_in", "experts_out"):
                parametrize.register_parametrization(module, pname, ExpertLoRA(getattr(module, pname), cfg.rank,
                                                                               cfg.scale))
                adapted.append(f"{path}.{pname}")
    if not adapted:
        raise ValueError(f"lora.targets = {cfg.targets}: no such layer in this model")
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return adapted


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors under their module paths (e.g. blocks.0.attn.qkv_proj.lora_A)."""
    return {_clean(k): v for k, v in model.state_dict().items() if "lora_" in k}


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor], where: str = "adapter") -> None:
    """Load `adapter_state`'s tensors into a model `apply_lora` prepared with the same config."""
    own = {_clean(k): k for k in model.state_dict() if "lora_" in k}
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or extra:
        raise CheckpointError(f"{where} does not fit this model's adapters: missing {missing[:3]}, unexpected {extra[:3]}")
    shapes = model.state_dict()
    for key, value in state.items():
        if tuple(value.shape) != tuple(shapes[own[key]].shape):
            raise CheckpointError(f"{where} does not fit this model: {key} is {tuple(value.shape)}, this model's "
                                  f"adapter there is {tuple(shapes[own[key]].shape)} (an adapter made for a base of "
                                  "another shape)")
    model.load_state_dict({own[k]: v for k, v in state.items()}, strict=False)


def _clean(key: str) -> str:
    """A parametrized expert's adapter lives at `...parametrizations.experts_in.0.lora_A`: name it plainly."""
    return key.replace("parametrizations.", "").replace(".0.lora_", ".lora_")


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """The model without its adapters for the duration (the base: DPO/GRPO's reference, no second copy)."""
    wrapped = [m for m in model.modules() if isinstance(m, (LoRALinear, ExpertLoRA))]
    for m in wrapped:
        m.disabled = True
    try:
        yield model
    finally:
        for m in wrapped:
            m.disabled = False


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight and remove the wrappers (the model is a plain one again;
    a quantized model is dequantized, see the module docstring)."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, child_name, child.merge())
        if parametrize.is_parametrized(module):
            for pname in list(module.parametrizations.keys()):
                parametrize.remove_parametrizations(module, pname, leave_parametrized=True)
    model.to_float()  # a quantized model's other layers too: the merged model is an ordinary float one
    for p in model.parameters():
        p.requires_grad_(True)
    return model
