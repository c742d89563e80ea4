"""`quantize_model`: swap a model's weights for int8 / int4 ones, by round-to-nearest or GPTQ.

    report = quantize_model(model, "int4", group_size=64)                   # RTN, in place
    report = quantize_model(model, "gptq", bits=4, calibration=rows, act_order=True)
    report.errors()   # {layer: ||WX - QX||^2 / ||WX||^2 on the calibration inputs}  (GPTQ)

What is quantized: every nn.Linear in the blocks (attention, MLA's projections, dense MLPs, shared
experts) and every MoE's stacked experts; MoE routers stay float (tiny, and a flipped routing
decision costs more than the bytes saved), and so do norms, the embedding and the output layer
unless `include_embeddings` (the embedding table then quantized by RTN, being a lookup; an
untied output layer by the method asked for; a tied one is the embedding table).

GPTQ runs block by block, as the paper does: calibration tokens go through the model up to block
0; within a block, the layers are quantized in the order the forward reaches them ("stages":
layers that read the same tensor, such as MLA's q_proj and kv_down, share one), each stage's
Hessians captured with forward hooks while the stages before it already run quantized; then the
calibration activations go through the quantized block to become the next block's inputs. Each
expert of a MoE gets the Hessian of the tokens routed to it (an expert no calibration token
reaches is rounded to nearest, and the report says so).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from groundup.config import ConfigError
from groundup.errors import DataError
from groundup.model.moe import MoE
from groundup.model.transformer import Transformer
from groundup.quant.formats import (dequantize_int4, dequantize_int8, quantize_int4, quantize_int4_unpacked,
                                    quantize_int8)
from groundup.quant.gptq import DAMP, Hessian, error_terms, gptq, relative_error
from groundup.quant.modules import (QuantEmbedding, QuantLinear, QuantMoE, QuantWeight, QuantizedTransformer,
                                    moe_forward)
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


def _set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, attr, module)


def _weight_error(w: torch.Tensor, q: torch.Tensor) -> float:
    w, q = w.float(), q.float()
    den = float(w.square().sum())
    return float((w - q).square().sum()) / den if den > 0 else 0.0


def _rtn_dequant(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    if spec.fmt == "int8":
        return dequantize_int8(*quantize_int8(w))
    return dequantize_int4(*quantize_int4(w, spec.group_size), spec.group_size)


def _eager_dequant(q: QuantWeight) -> torch.Tensor:
    """The float32 weight, without compiling anything (reports only)."""
    if q.fmt == "int8":
        return dequantize_int8(q.qweight, q.scales)
    return dequantize_int4(q.qweight, q.scales, q.zeros, q.group_size)


def _cast_scales(q: QuantWeight, like: torch.Tensor) -> QuantWeight:
    """Scales in the replaced weight's dtype (as model.to(dtype) would leave them)."""
    if q.scales.dtype != like.dtype and like.is_floating_point():
        q.scales = q.scales.to(like.dtype)
    return q


# ----------------------------------------------------------------------------- the entry point


def quantize_model(model: Transformer, method: str, *, bits: int | None = None, group_size: int | None = None,
                   calibration: torch.Tensor | Sequence[Sequence[int]] | None = None, act_order: bool = False,
                   include_embeddings: bool = False, damp: float = DAMP, batch_size: int = 8,
                   progress: Callable[[str], None] | None = None) -> QuantizeReport:
    """Quantize `model` in place (it becomes a QuantizedTransformer) and report per layer.

    `calibration` (GPTQ only): token rows, a (rows, T) LongTensor or lists of ids."""
    if is_quantized_model(model):
        spec = getattr(model, "quant_spec", None)
        raise ConfigError(f"the model is already quantized ({spec.describe() if spec else 'quantized modules'}); "
                          "quantize the full-precision model instead", key="method")
    spec = QuantSpec.make(method, bits, group_size, act_order, include_embeddings)
    if not damp > 0:
        raise ConfigError(f"--damp {damp}: expected a positive fraction of the mean Hessian diagonal", key="damp")
    units = plan_units(model, spec)
    note = progress or (lambda s: None)
    start = time.perf_counter()
    model.eval()
    with torch.no_grad():
        if spec.method == "gptq":
            rows = _calibration_rows(calibration)
            longest = max(len(r) for r in rows)
            if longest > model.cfg.max_seq_len:
                raise ConfigError(f"calibration rows of {longest} tokens exceed the model's context "
                                  f"({model.cfg.max_seq_len}); split them (--seq-len)", key="seq_len")
            spec.calibration_tokens = sum(len(r) for r in rows)
            layers = _gptq_model(model, spec, units, rows, batch_size, damp, note)
        else:
            if calibration is not None:
                raise ConfigError(f"calibration data applies to --method gptq only, not {spec.method}",
                                  key="calibration")
            layers = [_rtn_unit(model, spec, u) for u in units if not u.kind.startswith("experts")]
            held: dict[str, dict[str, QuantWeight]] = {}
            for u in units:
                if u.kind.startswith("experts"):
                    report, q = _rtn_experts(model, spec, u)
                    layers.append(report)
                    held.setdefault(u.owner, {})[u.kind] = q
            for owner, pair in held.items():
                _set_module(model, owner, QuantMoE(model.get_submodule(owner), pair["experts_in"], pair["experts_out"]))
            order = {u.name: i for i, u in enumerate(units)}
            layers.sort(key=lambda r: order[r.name])
    spec.modules = [u.name for u in units]
    model.__class__ = QuantizedTransformer
    model.quant_spec = spec
    return QuantizeReport(spec, layers, time.perf_counter() - start)


def _calibration_rows(calibration) -> list[torch.Tensor]:
    if calibration is None:
        raise ConfigError("GPTQ needs calibration text: give --calibration FILES (text or JSONL records)",
                          key="calibration")
    if isinstance(calibration, torch.Tensor):
        calibration = calibration.reshape(-1, calibration.shape[-1]) if calibration.dim() > 1 else [calibration]
    rows = [torch.as_tensor(r, dtype=torch.long) for r in calibration]
    rows = [r for r in rows if r.numel()]
    if not rows:
        raise ConfigError("GPTQ needs calibration tokens: none given", key="calibration")
    return rows


# ----------------------------------------------------------------------------- round to nearest


def _rtn_unit(model: Transformer, spec: QuantSpec, unit: Unit) -> LayerReport:
    fmt, g = spec.fmt, spec.group_size
    if unit.kind in ("linear", "lm_head"):
        linear = model.get_submodule(unit.name)
        q = _cast_scales(QuantLinear.from_linear(linear, fmt, g), linear.weight)
        report = LayerReport(unit.name, unit.shape, "rtn", _weight_error(linear.weight, _eager_dequant(q)))
        _set_module(model, unit.name, q)
        return report
    if unit.kind == "embed":
        emb = model.embed
        q = _cast_scales(QuantEmbedding.from_embedding(emb, fmt, g), emb.weight)
        report = LayerReport(unit.name, unit.shape, "rtn", _weight_error(emb.weight, _eager_dequant(q)))
        model.embed = q
        return report
    raise ValueError(f"{unit.name}: stacked experts are quantized by _rtn_experts")


def _rtn_experts(model: Transformer, spec: QuantSpec, unit: Unit) -> tuple[LayerReport, QuantWeight]:
    w = getattr(model.get_submodule(unit.owner), unit.kind)
    q = _cast_scales(QuantWeight.from_float(w, spec.fmt, spec.group_size), w)
    return LayerReport(unit.name, unit.shape, "rtn", _weight_error(w, _eager_dequant(q))), q


# ----------------------------------------------------------------------------- GPTQ, block by block


class _Caught(Exception):
    pass


def _gptq_model(model: Transformer, spec: QuantSpec, units: list[Unit], rows: list[torch.Tensor],
                batch_size: int, damp: float, note: Callable[[str], None]) -> list[LayerReport]:
    device = next(p.device for p in model.parameters())
    # Calibration batches (rows of equal length together) and block 0's inputs for each.
    by_len: dict[int, list[torch.Tensor]] = {}
    for r in rows:
        by_len.setdefault(len(r), []).append(r)
    states = []  # per batch: [x, (cos, sin, mask, cache)]

    def catch(module, args):
        raise _Caught(args)

    handle = model.blocks[0].register_forward_pre_hook(catch)
    try:
        for same in by_len.values():
            for i in range(0, len(same), batch_size):
                try:
                    model(torch.stack(same[i : i + batch_size]).to(device))
                except _Caught as c:
                    args = c.args[0]
                    states.append([args[0], tuple(args[1:])])
    finally:
        handle.remove()

    reports: list[LayerReport] = []
    n_blocks = len(model.blocks)
    for b in range(n_blocks):
        t0 = time.perf_counter()
        block = model.blocks[b]
        block_units = [u for u in units if u.name.startswith(f"blocks.{b}.")]
        block_reports = _gptq_block(model, block, block_units, states, spec, damp)
        reports += block_reports
        for s in states:  # the next block's inputs come through the quantized block
            s[0] = block(s[0], *s[1])[0]
        gptq_err = [r.output_error for r in block_reports if r.output_error is not None]
        rtn_err = [r.rtn_output_error for r in block_reports if r.rtn_output_error is not None]
        summary = (f"mean output error {sum(gptq_err) / len(gptq_err):.3g} (round-to-nearest: "
                   f"{sum(rtn_err) / len(rtn_err):.3g})" if gptq_err else "")
        note(f"block {b + 1}/{n_blocks}: {len(block_reports)} weights quantized in "
             f"{time.perf_counter() - t0:.1f}s; {summary}")

    for unit in units:  # outside the blocks
        if unit.kind == "lm_head":
            reports.append(_gptq_head(model, unit, states, spec, damp))
        elif unit.kind == "embed":  # a lookup, not a matmul: round to nearest (a tied one is also the output)
            report = _rtn_unit(model, spec, unit)
            report.how = "rtn (an embedding is a lookup)"
            reports.append(report)
    return reports


def _gptq_block(model, block, units: list[Unit], states, spec: QuantSpec, damp: float):
    by_name = {u.name: u for u in units}
    moes = {u.owner: model.get_submodule(u.owner) for u in units if u.kind.startswith("experts")}
    quantized_experts: dict[str, dict[str, QuantWeight]] = {name: {} for name in moes}
    recorder: list[Callable | None] = [None]

    def patch(moe_name: str, moe: MoE):
        def forward(x):
            def mm(which):
                unit_name = f"{moe_name}.{which}"

                def run(e, rows):
                    if recorder[0] is not None:
                        recorder[0](unit_name, e, rows)
                    q = quantized_experts[moe_name].get(which)
                    return q.matmul(rows, e) if q is not None else F.linear(rows, getattr(moe, which)[e])
                return run
            return moe_forward(moe, x, mm("experts_in"), mm("experts_out"))
        moe.forward = forward  # an instance attribute: this MoE only, undone below

    for name, moe in moes.items():
        patch(name, moe)
    reports = []
    try:
        for stage in _stages(model, block, units, states[0], recorder):
            hessians: dict[str, object] = {}
            hooks = []
            for name in stage:
                unit = by_name[name]
                if unit.kind == "linear":
                    h = hessians[name] = Hessian(unit.shape[-1], states[0][0].device)
                    hooks.append(model.get_submodule(name).register_forward_pre_hook(
                        lambda m, args, h=h: h.add(args[0])))
                else:
                    hessians[name] = {}

            def record(unit_name, e, rows, stage=stage):
                if unit_name in stage:
                    per_expert = hessians[unit_name]
                    if e not in per_expert:
                        per_expert[e] = Hessian(rows.shape[-1], rows.device)
                    per_expert[e].add(rows)

            recorder[0] = record
            try:
                for x, args in states:
                    block(x, *args)
            finally:
                recorder[0] = None
                for h in hooks:
                    h.remove()
            for name in stage:
                unit = by_name[name]
                if unit.kind == "linear":
                    reports.append(_gptq_linear(model, unit, hessians[name], spec, damp))
                else:
                    report, q = _gptq_experts(getattr(moes[unit.owner], unit.kind), unit, hessians[name], spec, damp)
                    quantized_experts[unit.owner][unit.kind] = q
                    reports.append(report)
    finally:
        for moe in moes.values():
            moe.__dict__.pop("forward", None)
    done = {r.name for r in reports}
    for unit in units:  # a weight the forward never reached (cannot happen in this model): round it
        if unit.name in done:
            continue
        if unit.kind == "linear":
            report = _rtn_unit(model, spec, unit)
        else:
            report, quantized_experts[unit.owner][unit.kind] = _rtn_experts(model, spec, unit)
        report.how = "rtn (no calibration input reached it)"
        reports.append(report)
    for name, moe in moes.items():
        held = quantized_experts[name]
        _set_module(model, name, QuantMoE(moe, held["experts_in"], held["experts_out"]))
    order = {u.name: i for i, u in enumerate(units)}
    return sorted(reports, key=lambda r: order.get(r.name, len(order)))


def _stages(model, block, units: list[Unit], state, recorder) -> list[list[str]]:
    """The block's units in the order the forward reaches them, grouped into stages: a unit that
    reads the very tensor an earlier unit read joins that unit's stage, any other starts a new one
    after all others (so a stage never depends on a unit of its own or a later stage)."""
    firsts: list[tuple[str, torch.Tensor | None]] = []
    seen: set[str] = set()

    def see(name, inp):
        if name not in seen:
            seen.add(name)
            firsts.append((name, inp))  # holds the tensor: ids stay unique while we compare

    hooks = [model.get_submodule(u.name).register_forward_pre_hook(lambda m, args, n=u.name: see(n, args[0]))
             for u in units if u.kind == "linear"]
    recorder[0] = lambda name, e, rows: see(name, None)
    try:
        x, args = state
        block(x, *args)
    finally:
        recorder[0] = None
        for h in hooks:
            h.remove()
    stages: list[list[str]] = []
    stage_of: dict[str, int] = {}
    for i, (name, inp) in enumerate(firsts):
        shared = next((stage_of[n] for n, t in firsts[:i] if inp is not None and t is inp), None)
        if shared is None:
            stages.append([name])
            stage_of[name] = len(stages) - 1
        else:
            stages[shared].append(name)
            stage_of[name] = shared
    return stages


def _gptq_weight(W: torch.Tensor, h: Hessian, spec: QuantSpec, damp: float, name: str):
    """GPTQ, dampening 10x more (twice at most) when the Hessian is too ill-conditioned to factor."""
    for attempt in range(3):
        try:
            return gptq(W, h.H, spec.fmt, spec.group_size, spec.act_order, damp=damp * 10**attempt)
        except torch.linalg.LinAlgError:
            continue
    raise DataError(f"GPTQ: the calibration inputs of {name} give a Hessian that cannot be factored even with "
                    f"dampening {damp * 100:g} (non-finite activations?); check the model and the calibration text")


def _gptq_linear(model, unit: Unit, h: Hessian, spec: QuantSpec, damp: float) -> LayerReport:
    linear = model.get_submodule(unit.name)
    W = linear.weight.detach().float()
    if h.n == 0:
        report = _rtn_unit(model, spec, unit)
        report.how = "rtn (no calibration input reached it)"
        return report
    qi, s, z, Qd = _gptq_weight(W, h, spec, damp, unit.name)
    q = _cast_scales(QuantLinear.from_linear(linear, spec.fmt, spec.group_size, integers=(qi, s, z)), linear.weight)
    report = LayerReport(unit.name, unit.shape, "gptq", _weight_error(W, Qd), relative_error(W, Qd, h.H),
                         relative_error(W, _rtn_dequant(W, spec), h.H), h.n)
    _set_module(model, unit.name, q)
    return report


def _gptq_experts(weights: torch.Tensor, unit: Unit, hessians: dict[int, Hessian], spec: QuantSpec, damp: float):
    qs, ss, zs, deq = [], [], [], []
    num = den = rtn_num = 0.0
    tokens, unseen = 0, 0
    for e in range(weights.shape[0]):
        W = weights[e].detach().float()
        h = hessians.get(e)
        if h is None or h.n == 0:
            unseen += 1
            if spec.fmt == "int8":
                qi, s = quantize_int8(W)
                z = None
            else:
                qi, s, z = quantize_int4_unpacked(W, spec.group_size)
                z = z.float()
            qi = qi.float()
            Qd = _rtn_dequant(W, spec)
        else:
            qi, s, z, Qd = _gptq_weight(W, h, spec, damp, f"{unit.name}[{e}]")
            n1, d1 = error_terms(W, Qd, h.H)
            r1, _ = error_terms(W, _rtn_dequant(W, spec), h.H)
            num, den, rtn_num, tokens = num + n1 * h.n, den + d1 * h.n, rtn_num + r1 * h.n, tokens + h.n
        qs.append(qi)
        ss.append(s)
        zs.append(z)
        deq.append(Qd)
    q = QuantWeight.from_integers(torch.stack(qs), torch.stack(ss), None if spec.fmt == "int8" else torch.stack(zs),
                                  spec.fmt, spec.group_size)
    _cast_scales(q, weights)
    how = "gptq" if not unseen else \
        f"gptq ({unseen} of {weights.shape[0]} experts got no calibration token: rounded to nearest)"
    report = LayerReport(unit.name, unit.shape, how, _weight_error(weights, torch.stack(deq)),
                         num / den if den > 0 else None, rtn_num / den if den > 0 else None, tokens)
    return report, q


def _gptq_head(model, unit: Unit, states, spec: QuantSpec, damp: float) -> LayerReport:
    h = Hessian(unit.shape[-1], states[0][0].device)
    for x, _ in states:
        h.add(model.norm(x) if model.norm is not None else x)
    return _gptq_linear(model, unit, h, spec, damp)
