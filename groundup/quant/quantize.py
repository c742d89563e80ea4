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
from typing import Callable, Sequence

import torch

from groundup.config import ConfigError
from groundup.model.transformer import Transformer
from groundup.quant.gptq import DAMP
from groundup.quant.gptq_model import gptq_model
from groundup.quant.modules import QuantMoE, QuantWeight, QuantizedTransformer
from groundup.quant.spec import QuantSpec
from groundup.quant.units import QuantizeReport, is_quantized_model, plan_units, rtn_experts, rtn_unit, set_module


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
            layers = gptq_model(model, spec, units, rows, batch_size, damp, note)
        else:
            if calibration is not None:
                raise ConfigError(f"calibration data applies to --method gptq only, not {spec.method}",
                                  key="calibration")
            layers = [rtn_unit(model, spec, u) for u in units if not u.kind.startswith("experts")]
            held: dict[str, dict[str, QuantWeight]] = {}
            for u in units:
                if u.kind.startswith("experts"):
                    report, q = rtn_experts(model, spec, u)
                    layers.append(report)
                    held.setdefault(u.owner, {})[u.kind] = q
            for owner, pair in held.items():
                set_module(model, owner, QuantMoE(model.get_submodule(owner), pair["experts_in"], pair["experts_out"]))
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
