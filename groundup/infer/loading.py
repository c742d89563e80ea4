"""Load a model and its tokenizer for inference, refusing pairs that do not belong together.

Accepted as the checkpoint: a model directory (model.safetensors + model.toml, tokenizer in
MODEL/tokenizer) or a training run directory (its `checkpoints/latest`, tokenizer in RUN/tokenizer).
A checkpoint written by `groundup train` records the tokenizer's hash in its meta.json; a tokenizer
with another hash, or more tokens than the model has embeddings, is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch

from groundup.config import ConfigError
from groundup.errors import CheckpointError
from groundup.layout import (CHECKPOINT_META_FILE, TOKENIZER_DIR, check_tokenizer_fits, find_tokenizer_dir,
                             read_checkpoint_meta, resolve_model_dir)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"dtype = {dtype!r}: expected one of {', '.join(DTYPES)}", key="dtype")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    """`auto` picks CUDA when present; asking for an absent CUDA is a clear error, not a crash later."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device = {device!r}: expected cpu, cuda, cuda:N or auto", key="device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device = 'cuda': this torch has no CUDA device available (use --device cpu)",
                          key="device")
    return device


def load_for_inference(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                       tokenizer: str | Path | None = None):
    """(model in eval mode, tokenizer) for a checkpoint path; see the module docstring."""
    from groundup.model.io import load_model
    from groundup.tokenizer import load_tokenizer

    device, dtype = resolve_device(device), resolve_dtype(dtype)
    model_dir = resolve_model_dir(path)
    tok_dir = Path(tokenizer) if tokenizer else find_tokenizer_dir(model_dir)
    if tok_dir is None:
        raise CheckpointError(f"{model_dir}: no tokenizer found beside the checkpoint (looked for "
                              f"{model_dir / TOKENIZER_DIR} and {model_dir.parent.parent / TOKENIZER_DIR}); "
                              "pass one with --tokenizer")
    tok = load_tokenizer(tok_dir)
    recorded = _recorded_tokenizer_hash(model_dir)
    if recorded and recorded != tok.hash:
        raise CheckpointError(f"{tok_dir}: tokenizer hash {tok.hash} differs from {recorded}, the one "
                              f"{model_dir} was trained with")
    model = load_model(model_dir, device, dtype).eval()
    check_tokenizer_fits(tok.vocab_size, model.cfg.vocab_size, tok_dir, model_dir)
    return model, tok


def _recorded_tokenizer_hash(model_dir: Path) -> str | None:
    """The hash a checkpoint's meta.json records (resolve_model_dir has verified the checkpoint)."""
    if not (model_dir / CHECKPOINT_META_FILE).is_file():
        return None
    value = read_checkpoint_meta(model_dir).get("tokenizer_hash")
    return value if isinstance(value, str) else None
