"""The load site: a model directory's model, quantized or full precision.

    model = load_model("runs/sft-int8")     # a QuantizedTransformer: integer weights, quantized kernels
    model = load_model("runs/sft")          # a Transformer in full precision

The choice is made here, where the weights are read (as gpt-fast makes it), so the model package never
needs to know that quantized layers exist: a directory whose model.toml has a [quantization] table is
built with its quantized modules (quantized_dir.py), any other with model/model_dir.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from groundup.model.model_dir import load_float_model
from groundup.model.transformer import Transformer
from groundup.quant.quantized_dir import is_quantized, load_quantized_model


def load_model(model_dir: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> Transformer:
    """A model directory's model, ready for generate, chat, eval and serve; a quantized one keeps its
    quantized layers (`dtype` then casts only its float tensors)."""
    if is_quantized(model_dir):
        return load_quantized_model(model_dir, device, dtype)
    return load_float_model(model_dir, device, dtype)
