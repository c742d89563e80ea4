"""GPTQ over a whole model, block by block (quantize.py's docstring says how): calibration batches
through the blocks, Hessians per stage captured with hooks, each linear layer, expert and the head
quantized by groundup/quant/gptq.py's algorithm."""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.nn.functional as F

from groundup.errors import DataError
from groundup.model.moe import MoE
from groundup.model.transformer import Transformer
from groundup.quant.formats import quantize_int4_unpacked, quantize_int8
from groundup.quant.gptq import Hessian, error_terms, gptq, relative_error
from groundup.quant.modules import QuantLinear, QuantMoE, QuantWeight, moe_forward
from groundup.quant.spec import QuantSpec
from groundup.quant.units import (LayerReport, Unit, cast_scales, rtn_dequant, rtn_experts, rtn_unit, set_module,
                                  weight_error)


class _Caught(Exception):
    pass


def gptq_model(model: Transformer, spec: QuantSpec, units: list[Unit], rows: list[torch.Tensor],
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
            report = rtn_unit(model, spec, unit)
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
            report = rtn_unit(model, spec, unit)
        else:
            report, quantized_experts[unit.owner][unit.kind] = rtn_experts(model, spec, unit)
        report.how = "rtn (no calibration input reached it)"
        reports.append(report)
    for name, moe in moes.items():
        held = quantized_experts[name]
        set_module(model, name, QuantMoE(moe, held["experts_in"], held["experts_out"]))
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
        report = rtn_unit(model, spec, unit)
        report.how = "rtn (no calibration input reached it)"
        return report
    qi, s, z, Qd = _gptq_weight(W, h, spec, damp, unit.name)
    q = cast_scales(QuantLinear.from_linear(linear, spec.fmt, spec.group_size, integers=(qi, s, z)), linear.weight)
    report = LayerReport(unit.name, unit.shape, "gptq", weight_error(W, Qd), relative_error(W, Qd, h.H),
                         relative_error(W, rtn_dequant(W, spec), h.H), h.n)
    set_module(model, unit.name, q)
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
            Qd = rtn_dequant(W, spec)
        else:
            qi, s, z, Qd = _gptq_weight(W, h, spec, damp, f"{unit.name}[{e}]")
            n1, d1 = error_terms(W, Qd, h.H)
            r1, _ = error_terms(W, rtn_dequant(W, spec), h.H)
            num, den, rtn_num, tokens = num + n1 * h.n, den + d1 * h.n, rtn_num + r1 * h.n, tokens + h.n
        qs.append(qi)
        ss.append(s)
        zs.append(z)
        deq.append(Qd)
    q = QuantWeight.from_integers(torch.stack(qs), torch.stack(ss), None if spec.fmt == "int8" else torch.stack(zs),
                                  spec.fmt, spec.group_size)
    cast_scales(q, weights)
    how = "gptq" if not unseen else \
        f"gptq ({unseen} of {weights.shape[0]} experts got no calibration token: rounded to nearest)"
    report = LayerReport(unit.name, unit.shape, how, weight_error(weights, torch.stack(deq)),
                         num / den if den > 0 else None, rtn_num / den if den > 0 else None, tokens)
    return report, q


def _gptq_head(model, unit: Unit, states, spec: QuantSpec, damp: float) -> LayerReport:
    h = Hessian(unit.shape[-1], states[0][0].device)
    for x, _ in states:
        h.add(model.norm(x) if model.norm is not None else x)
    return _gptq_linear(model, unit, h, spec, damp)
