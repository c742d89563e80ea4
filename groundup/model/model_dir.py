"""Model directories: weights in safetensors (no pickle) and the resolved config in TOML.

    OUT/model.safetensors   every persistent tensor (tied output weights stored once)
    OUT/model.toml          the ModelConfig, loadable by `groundup model info OUT/model.toml`

Loading never runs code from the files: safetensors holds raw tensors, TOML holds values.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from groundup.config import from_dict, read_toml, save_config
from groundup.errors import CheckpointError
from groundup.io import atomic_open
from groundup.layout import MODEL_CONFIG_FILE, QUANTIZATION_TABLE, WEIGHTS_FILE
from groundup.model.config import ModelConfig
from groundup.model.sizing import check_fits
from groundup.model.transformer import Transformer


def save_weights(model: Transformer, path: str | Path, metadata: dict | None = None) -> None:
    """Write the model's persistent tensors to a safetensors file, atomically."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    meta = {"format": "pt", "groundup_model_config": json.dumps(dataclasses.asdict(model.cfg))}
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    with atomic_open(path, "wb") as f:
        f.write(save(state, metadata=meta))


def save_model(model: Transformer, out_dir: str | Path, metadata: dict | None = None) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_weights(model, out_dir / WEIGHTS_FILE, metadata)
    save_config(model.cfg, out_dir / MODEL_CONFIG_FILE)
    return out_dir


def load_model_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / MODEL_CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{model_dir}: no {MODEL_CONFIG_FILE} (not a groundup model directory)")
    data = read_toml(path)
    if QUANTIZATION_TABLE in data:
        raise CheckpointError(f"{path}: a quantized model (its [{QUANTIZATION_TABLE}] table); load it with "
                              "groundup.quant.load.load_model")
    return from_dict(ModelConfig, data)


def load_state(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: weights file not found")
    try:
        state = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable safetensors file ({e})") from None
    check_finite(state, str(path))
    return state


def check_finite(state: dict[str, torch.Tensor], where: str) -> None:
    """Refuse weights holding NaN or infinity, naming the first such tensor: every verb that reads weights
    (load_state, import hf / gguf, adapters) calls this, so corrupt weights never reach a model (whose every
    output would be NaN, and whose quantized, exported or evaluated copy would look fine)."""
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            raise CheckpointError(f"{where}: tensor {name} holds non-finite values ({nan:,} NaN, {inf:,} infinite "
                                  f"of {t.numel():,}): corrupt weights (a diverged run or a damaged file)")


def build_from_state(cfg: ModelConfig, state: dict[str, torch.Tensor], device: str | torch.device = "cpu",
                     dtype: torch.dtype | None = None, source: str = "weights") -> Transformer:
    """A model with exactly `state`'s tensors, built without a wasted random initialisation."""
    with torch.device("meta"):
        model = Transformer(cfg)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise CheckpointError(f"{source} do not match the model config: {e}") from None
    model.reset_buffers()  # the RoPE tables and MoE statistics are not in the file
    model.to(device=device, dtype=dtype)
    model.reset_buffers()  # RoPE tables stay float32 whatever the weights' dtype
    if dtype == torch.float16:  # float16's range ends at 65,504: larger weights become infinite in the cast
        for name, t in model.state_dict().items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise CheckpointError(f"{source}: tensor {name} does not fit in float16 (values beyond +-65,504 "
                                      "become infinite); load it as bfloat16 or float32")
    return model


def load_float_model(model_dir: str | Path, device: str | torch.device = "cpu",
                     dtype: torch.dtype | None = None) -> Transformer:
    """A full-precision model directory's model. A quantized directory is refused by `load_model_config`:
    `groundup.quant.load.load_model` is the load site that takes either kind."""
    model_dir = Path(model_dir)
    cfg = load_model_config(model_dir)
    check_fits(cfg, device, torch.finfo(dtype).bits // 8 if dtype is not None else 4, "its weights")
    state = load_state(model_dir / WEIGHTS_FILE, device)
    return build_from_state(cfg, state, device, dtype, source=str(model_dir / WEIGHTS_FILE))
