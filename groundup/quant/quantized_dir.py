"""Quantized model directories: the same layout as any model directory (groundup/layout.py).

    MODEL/model.safetensors   integer weights (int8; int4 packed two per uint8) with their scales
                              (and zero points), plus every float tensor the model keeps
    MODEL/model.toml          the ModelConfig, then a [quantization] table (see spec.py)
    MODEL/tokenizer/          copied from the source model

Loading runs no code from the files: the model is built on the meta device from model.toml,
the quantized modules its `modules` list names are swapped in, and the tensors are assigned.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import torch
from safetensors.torch import save
from torch import nn

from groundup.config import ConfigError, from_dict, read_toml, to_toml
from groundup.errors import CheckpointError
from groundup.io import atomic_write_bytes, atomic_write_text
from groundup.layout import MODEL_CONFIG_FILE, QUANTIZATION_TABLE, WEIGHTS_FILE
from groundup.model.config import ModelConfig
from groundup.model.model_dir import load_state
from groundup.model.moe import MoE
from groundup.quant.modules import QuantEmbedding, QuantLinear, QuantMoE, QuantWeight, QuantizedTransformer
from groundup.quant.spec import QuantSpec



def is_quantized(model_dir: str | Path) -> bool:
    """True when MODEL/model.toml has a [quantization] table (valid or not: load_quantized_model
    then says what is wrong with it)."""
    try:
        with (Path(model_dir) / MODEL_CONFIG_FILE).open("rb") as f:
            return QUANTIZATION_TABLE in tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False


def read_quant_spec(model_dir: str | Path, strict: bool = True) -> QuantSpec | None:
    """The [quantization] table of MODEL/model.toml, or None when it has none (or, unless
    `strict`, when the file is missing or unreadable)."""
    path = Path(model_dir) / MODEL_CONFIG_FILE
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        if strict:
            read_toml(path)  # raises the usual ConfigError naming the file
        return None
    table = data.get(QUANTIZATION_TABLE)
    if table is None:
        return None
    if not isinstance(table, dict):
        if strict:
            raise CheckpointError(f"{path}: [{QUANTIZATION_TABLE}] is not a table")
        return None
    try:
        return QuantSpec.from_dict(table, str(path))
    except ValueError as e:
        if strict:
            raise CheckpointError(str(e)) from None
        return None


def save_quantized_model(model: QuantizedTransformer, out_dir: str | Path, metadata: dict | None = None) -> Path:
    """Write MODEL/model.safetensors and MODEL/model.toml (the caller copies the tokenizer)."""
    spec = getattr(model, "quant_spec", None)
    if not isinstance(model, QuantizedTransformer) or spec is None:
        raise ConfigError("save_quantized_model: the model is not quantized (run quantize_model first)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    meta = {"format": "pt", "groundup_model_config": json.dumps(dataclasses.asdict(model.cfg)),
            "groundup_quantization": json.dumps(spec.to_dict())}
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    atomic_write_bytes(out_dir / WEIGHTS_FILE, save(state, metadata=meta))
    atomic_write_text(out_dir / MODEL_CONFIG_FILE, to_toml(model.cfg) + "\n" + to_toml(spec.to_dict(), QUANTIZATION_TABLE))
    return out_dir


def build_quantized_skeleton(cfg: ModelConfig, spec: QuantSpec, where: str = "model") -> QuantizedTransformer:
    """The model on the meta device with empty quantized modules where `spec.modules` says."""
    with torch.device("meta"):
        model = QuantizedTransformer(cfg)
    fmt, g = spec.fmt, spec.group_size
    experts: dict[str, set[str]] = {}
    for name in spec.modules:
        owner, _, leaf = name.rpartition(".")
        try:
            module = model.get_submodule(name) if leaf not in ("experts_in", "experts_out") else None
            parent = model.get_submodule(owner) if owner else model
        except AttributeError:
            raise CheckpointError(f"{where}: [quantization] modules names {name!r}, which this model config has "
                                  "no such layer") from None
        if leaf in ("experts_in", "experts_out") and isinstance(parent, MoE):
            experts.setdefault(owner, set()).add(leaf)
            continue
        if isinstance(module, nn.Linear):
            if name.endswith(".router"):
                raise CheckpointError(f"{where}: [quantization] modules names the MoE router {name!r}, which is "
                                      "never quantized")
            new = QuantLinear(fmt, module.in_features, module.out_features, module.bias is not None, g, device="meta")
        elif isinstance(module, nn.Embedding) and name == "embed":
            new = QuantEmbedding(fmt, tuple(module.weight.shape), g, device="meta")
        else:
            raise CheckpointError(f"{where}: [quantization] modules names {name!r}, which is not a linear layer, "
                                  "the embedding or a MoE's experts")
        _check_group(new.in_features, g, name, where, fmt)
        setattr(parent, leaf, new)
    for owner, leaves in experts.items():
        if leaves != {"experts_in", "experts_out"}:
            raise CheckpointError(f"{where}: [quantization] modules names only {sorted(leaves)[0]} of {owner}; "
                                  "a MoE's experts_in and experts_out are quantized together")
        moe = model.get_submodule(owner)
        q_in = QuantWeight(fmt, tuple(moe.experts_in.shape), g, device="meta")
        q_out = QuantWeight(fmt, tuple(moe.experts_out.shape), g, device="meta")
        for q, leaf in ((q_in, "experts_in"), (q_out, "experts_out")):
            _check_group(q.in_features, g, f"{owner}.{leaf}", where, fmt)
        parent_name, _, leaf = owner.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, QuantMoE(moe, q_in, q_out))
    model.quant_spec = spec
    return model


def _check_group(K: int, g: int | None, name: str, where: str, fmt: str) -> None:
    if fmt == "int4" and K % g:
        raise CheckpointError(f"{where}: {name} has input dimension {K}, not a multiple of the group size {g}")


def load_quantized_model(model_dir: str | Path, device: str | torch.device = "cpu",
                         dtype: torch.dtype | None = None) -> QuantizedTransformer:
    """A quantized model directory as a Transformer (a QuantizedTransformer) in eval mode.

    `dtype` casts the float tensors (norms, biases, scales, unquantized embeddings); integer
    weights stay integers."""
    model_dir = Path(model_dir)
    config_path = model_dir / MODEL_CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{model_dir}: no {MODEL_CONFIG_FILE} (not a groundup model directory)")
    data = read_toml(config_path)
    if QUANTIZATION_TABLE not in data:
        raise CheckpointError(f"{model_dir}: not a quantized model (no [{QUANTIZATION_TABLE}] table in {MODEL_CONFIG_FILE}); "
                              "load it with groundup.quant.load.load_model")
    spec = read_quant_spec(model_dir)
    data.pop(QUANTIZATION_TABLE)
    cfg = from_dict(ModelConfig, data)
    weights = model_dir / WEIGHTS_FILE
    state = load_state(weights, device)
    model = build_quantized_skeleton(cfg, spec, str(config_path))
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise CheckpointError(f"{weights} does not match {config_path}: {e}") from None
    for name, module in model.named_modules():
        if isinstance(module, QuantWeight):
            _check_tensors(module, name, weights)
            module._kernel_cache = {}
    model.reset_buffers()  # RoPE tables and MoE statistics are not in the file
    model.to(device=device, dtype=dtype)
    model.reset_buffers()
    return model.eval()


def _check_tensors(module: QuantWeight, name: str, where: Path) -> None:
    expected = {"qweight": torch.int8 if module.fmt == "int8" else torch.uint8}
    if module.fmt == "int4":
        expected["zeros"] = torch.uint8
    for key, dtype in expected.items():
        got = getattr(module, key).dtype
        if got != dtype:
            raise CheckpointError(f"{where}: {name}.{key} is {got}, expected {dtype}")
    if not module.scales.is_floating_point():
        raise CheckpointError(f"{where}: {name}.scales is {module.scales.dtype}, expected a float type")
