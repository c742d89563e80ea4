"""`groundup import hf`: a local Hugging Face model directory as a groundup model directory.

Reads config.json (see hf_import_config for what is accepted) and safetensors weights, one file or
sharded with an index; `pytorch_model.bin` is refused, since unpickling it could run code. The
result is OUT/model.safetensors + OUT/model.toml, ready for `groundup train` (continued
pretraining), fine-tuning, `generate`, `chat` and `export hf`. The tokenizer comes along as
OUT/tokenizer: groundup's own format when the directory holds it (an exported groundup model's
does), otherwise its Hugging Face tokenizer.json with tokenizer_config.json (special tokens, chat
template), special_tokens_map.json and generation_config.json's eos ids. A tokenizer that cannot
be read (or has more ids than the model embeds) does not stop the import: the model is written
without it and the reason returned. An existing non-empty OUT is replaced only with `overwrite`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from groundup.device import resolve_dtype
from groundup.errors import CheckpointError, DataError
from groundup.interop.hf_import_config import model_config_from_hf
from groundup.interop.hf_weights import from_hf_state
from groundup.io import atomic_dir, read_json
from groundup.layout import (HF_CONFIG_FILE, HF_WEIGHTS_FILE, HF_WEIGHTS_INDEX_FILE, TOKENIZER_DIR, claim_output_dir,
                             mark_output_dir)
from groundup.model.model_dir import build_from_state, check_finite, save_model
from groundup.schema import check, relative_file
from groundup.tokenizer import load_tokenizer


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    index = hf_dir / HF_WEIGHTS_INDEX_FILE
    if (hf_dir / HF_WEIGHTS_FILE).is_file():
        files = [hf_dir / HF_WEIGHTS_FILE]
    elif index.is_file():
        listing = read_json(index, expect=dict)
        check(listing, {"weight_map": {}}, str(index))
        names = listing["weight_map"].values()
        if not all(isinstance(n, str) for n in names):
            raise DataError(f"{index}: weight_map: expected file names (strings)")
        files = [hf_dir / relative_file(n, str(index), "weight_map") for n in sorted(set(names))]
    elif any(hf_dir.glob("pytorch_model*.bin")):
        raise CheckpointError(f"{hf_dir}: only pytorch_model.bin weights; groundup imports safetensors only, because "
                              "loading a pickle can run code (convert it with a tool you trust)")
    else:
        raise CheckpointError(f"{hf_dir}: no {HF_WEIGHTS_FILE} or {HF_WEIGHTS_INDEX_FILE}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{f}: unreadable safetensors file ({e})") from None
        check_finite(state, str(f))
    return state


def import_hf(hf_dir: str | Path, out: str | Path, dtype: str | None = None,
              overwrite: bool = False) -> tuple[str, str | None]:
    """Write the groundup model directory; returns (architecture, why no tokenizer came along or None)."""

    hf_dir = Path(hf_dir)
    claim_output_dir(out, "import hf", overwrite=overwrite, sources=[hf_dir])
    config_file = hf_dir / HF_CONFIG_FILE
    if not config_file.is_file():
        raise CheckpointError(f"{hf_dir}: not a Hugging Face model directory (no {HF_CONFIG_FILE})")
    arch, cfg = model_config_from_hf(read_json(config_file, expect=dict), str(config_file))
    state = from_hf_state(arch, cfg, read_hf_weights(hf_dir), str(hf_dir))
    model = build_from_state(cfg, state, dtype=resolve_dtype(dtype) if dtype else None, source=str(hf_dir))
    tok, no_tokenizer = None, None
    try:
        tok = load_tokenizer(hf_dir)
        if tok.vocab_size > cfg.vocab_size:
            tok, no_tokenizer = None, f"its {tok.vocab_size} tokens exceed the model's {cfg.vocab_size} embeddings"
    except DataError as e:
        no_tokenizer = str(e)
    with atomic_dir(out) as tmp:
        mark_output_dir(tmp, "import hf")
        save_model(model, tmp, metadata={"imported_from": arch})
        if tok is not None:
            tok.save(tmp / TOKENIZER_DIR)
    return arch, no_tokenizer
