"""What quantization works on: the units of a model (each linear layer, MoE expert stack, embedding)
and the per-layer report, round-to-nearest per unit, and the small helpers GPTQ shares with it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from groundup.config import ConfigError
from groundup.model.moe import MoE
from groundup.model.transformer import Transformer
from groundup.quant.formats import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from groundup.quant.modules import QuantEmbedding, QuantLinear, QuantWeight, QuantizedTransformer
from groundup.quant.spec import QuantSpec


@dataclass
class Unit:
    """One weight to quantize: a linear layer, a MoE's stacked experts_in / experts_out, embed, lm_head."""

    name: str
    kind: str  # "linear" | "experts_in" | "experts_out" | "embed" | "lm_head"
    shape: tuple[int, ...]

    @property
    def owner(self) -> str:  # the MoE module for experts, else the module itself
        return self.name.rsplit(".", 1)[0] if self.kind.startswith("experts") else self.name


@dataclass
class LayerReport:
    name: str
    shape: tuple[int, ...]
    how: str  # "rtn", "gptq", or "rtn (...)" where GPTQ had nothing to work with
    weight_error: float  # ||W - Q||^2 / ||W||^2
    output_error: float | None = None  # ||W X - Q X||^2 / ||W X||^2 on the calibration inputs (GPTQ)
    rtn_output_error: float | None = None  # the same for round-to-nearest, for comparison
    tokens: int | None = None  # calibration rows the layer saw

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items() if v is not None}


@dataclass
class QuantizeReport:
    spec: QuantSpec
    layers: list[LayerReport] = field(default_factory=list)
    seconds: float = 0.0

    def errors(self) -> dict[str, float]:
        """Per layer, the relative output reconstruction error (GPTQ) or weight error (RTN)."""
        return {r.name: r.output_error if r.output_error is not None else r.weight_error for r in self.layers}

    def to_dict(self) -> dict:
        return {"spec": self.spec.to_dict(), "seconds": round(self.seconds, 3),
                "layers": [r.to_dict() for r in self.layers]}


# ----------------------------------------------------------------------------- what to quantize


def is_quantized_model(model: nn.Module) -> bool:
    return isinstance(model, QuantizedTransformer) or any(isinstance(m, QuantWeight) for m in model.modules())


def plan_units(model: Transformer, spec: QuantSpec) -> list[Unit]:
    """Every weight `spec` quantizes, in model order; ConfigError for a layer the format cannot take."""
    units: list[Unit] = []
    for name, module in model.blocks.named_modules(prefix="blocks"):
        if isinstance(module, MoE):
            units.append(Unit(f"{name}.experts_in", "experts_in", tuple(module.experts_in.shape)))
            units.append(Unit(f"{name}.experts_out", "experts_out", tuple(module.experts_out.shape)))
        elif isinstance(module, nn.Linear) and not name.endswith(".router"):
            units.append(Unit(name, "linear", (module.out_features, module.in_features)))
    if spec.include_embeddings:
        units.append(Unit("embed", "embed", tuple(model.embed.weight.shape)))
        if model.lm_head is not None:
            units.append(Unit("lm_head", "lm_head", tuple(model.lm_head.weight.shape)))
    if spec.fmt == "int4":
        g = spec.group_size
        bad = [u for u in units if u.shape[-1] % g]
        if bad:
            u = bad[0]
            K = u.shape[-1]
            fits = [str(s) for s in (32, 64, 128) if K % s == 0]
            hint = (f"use --group-size {' or '.join(fits)}" if fits else
                    "no int4 group size divides it: use --method int8 or --bits 8")
            more = f" (and {len(bad) - 1} more layers)" if len(bad) > 1 else ""
            raise ConfigError(f"layer {u.name} has shape {'x'.join(map(str, u.shape))}: its input dimension {K} "
                              f"is not a multiple of the group size {g}{more}; {hint}", key="group_size")
    return units


def set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, attr, module)


def weight_error(w: torch.Tensor, q: torch.Tensor) -> float:
    w, q = w.float(), q.float()
    den = float(w.square().sum())
    return float((w - q).square().sum()) / den if den > 0 else 0.0


def rtn_dequant(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    if spec.fmt == "int8":
        return dequantize_int8(*quantize_int8(w))
    return dequantize_int4(*quantize_int4(w, spec.group_size), spec.group_size)


def eager_dequant(q: QuantWeight) -> torch.Tensor:
    """The float32 weight, without compiling anything (reports only)."""
    if q.fmt == "int8":
        return dequantize_int8(q.qweight, q.scales)
    return dequantize_int4(q.qweight, q.scales, q.zeros, q.group_size)


def cast_scales(q: QuantWeight, like: torch.Tensor) -> QuantWeight:
    """Scales in the replaced weight's dtype (as model.to(dtype) would leave them)."""
    if q.scales.dtype != like.dtype and like.is_floating_point():
        q.scales = q.scales.to(like.dtype)
    return q


# ----------------------------------------------------------------------------- the entry point


# ----------------------------------------------------------------------------- round to nearest


def rtn_unit(model: Transformer, spec: QuantSpec, unit: Unit) -> LayerReport:
    fmt, g = spec.fmt, spec.group_size
    if unit.kind in ("linear", "lm_head"):
        linear = model.get_submodule(unit.name)
        q = cast_scales(QuantLinear.from_linear(linear, fmt, g), linear.weight)
        report = LayerReport(unit.name, unit.shape, "rtn", weight_error(linear.weight, eager_dequant(q)))
        set_module(model, unit.name, q)
        return report
    if unit.kind == "embed":
        emb = model.embed
        q = cast_scales(QuantEmbedding.from_embedding(emb, fmt, g), emb.weight)
        report = LayerReport(unit.name, unit.shape, "rtn", weight_error(emb.weight, eager_dequant(q)))
        model.embed = q
        return report
    raise ValueError(f"{unit.name}: stacked experts are quantized by rtn_experts")


def rtn_experts(model: Transformer, spec: QuantSpec, unit: Unit) -> tuple[LayerReport, QuantWeight]:
    w = getattr(model.get_submodule(unit.owner), unit.kind)
    q = cast_scales(QuantWeight.from_float(w, spec.fmt, spec.group_size), w)
    return LayerReport(unit.name, unit.shape, "rtn", weight_error(w, eager_dequant(q))), q
