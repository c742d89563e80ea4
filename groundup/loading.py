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
from groundup.device import resolve_device, resolve_dtype
from groundup.errors import CheckpointError
from groundup.interop.peft_format import adapter_config, load_adapter
from groundup.layout import (CHECKPOINT_META_FILE, TOKENIZER_DIR, check_tokenizer_fits, find_tokenizer_dir,
                             is_adapter_dir, read_checkpoint_meta, resolve_model_dir)
from groundup.model.lora import merge_lora
from groundup.quant.load import load_model
from groundup.tokenizer import load_tokenizer

def load_for_inference(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                       tokenizer: str | Path | None = None, adapter: str | Path | None = None, merge: bool = False):
    """(model in eval mode, tokenizer) for a checkpoint path; see the module docstring.

    `adapter`: a LoRA adapter (an adapter directory, or a LoRA run: its newest intact checkpoint) to
    apply on top; a `path` that is itself an adapter loads the base it names. `merge` folds it in."""

    device, dtype = resolve_device(device), resolve_dtype(dtype)
    model_dir = resolve_model_dir(path)
    adapter_dir = resolve_model_dir(adapter) if adapter is not None else None
    if is_adapter_dir(model_dir):  # a LoRA run or adapter given as the model: load the base it was trained on
        if adapter_dir is not None:
            raise ConfigError(f"{path} is an adapter itself; pass the base model with --model", key="adapter")
        adapter_dir, base = model_dir, adapter_config(model_dir)[1].get("base")
        if not base:
            raise CheckpointError(f"{model_dir}: an adapter that does not name its base model; pass the base with "
                                  "--model and this directory with --adapter")
        model_dir = resolve_model_dir(base)
    if adapter_dir is not None and not is_adapter_dir(adapter_dir):
        raise CheckpointError(f"{adapter}: not a LoRA adapter (no adapter_model.safetensors)")
    found = find_tokenizer_dir(adapter_dir) if adapter_dir is not None else None
    tok_dir = Path(tokenizer) if tokenizer else found or find_tokenizer_dir(model_dir)
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
    if adapter_dir is not None:
        load_adapter(model, adapter_dir)
        if merge:
            merge_lora(model)
    return model, tok


def _recorded_tokenizer_hash(model_dir: Path) -> str | None:
    """The hash a checkpoint's meta.json records (resolve_model_dir has verified the checkpoint)."""
    if not (model_dir / CHECKPOINT_META_FILE).is_file():
        return None
    value = read_checkpoint_meta(model_dir).get("tokenizer_hash")
    return value if isinstance(value, str) else None
