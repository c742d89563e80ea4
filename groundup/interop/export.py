"""`groundup export hf`: a groundup checkpoint as a Hugging Face model directory.

    OUT/config.json              the architecture (see hf_config) and the original ModelConfig
    OUT/model.safetensors        weights under transformers' names (see hf_weights)
    OUT/generation_config.json   stops at the tokenizer's stop ids (end of text, end of turn, ...)
    OUT/tokenizer.json, tokenizer_config.json, special_tokens_map.json (+ groundup_tokenizer.json)

`AutoModelForCausalLM.from_pretrained(OUT)` and `AutoTokenizer.from_pretrained(OUT)` load it with no
custom code. The tokenizer is either backend: groundup's is written as Hugging Face files, a Hugging
Face one (an imported model's) is copied. The directory is built under a temporary name and renamed
when complete; an existing non-empty OUT is replaced only with `overwrite`, and never when it is or
holds the checkpoint being exported.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from groundup.device import resolve_dtype
from groundup.errors import CheckpointError
from groundup.interop.hf_config import choose_architecture, hf_config
from groundup.interop.hf_tokenizer import write_tokenizer_files
from groundup.interop.hf_weights import to_hf_state
from groundup.io import atomic_dir, atomic_write_json, follow_umask
from groundup.layout import (HF_CONFIG_FILE, HF_GENERATION_CONFIG_FILE, HF_WEIGHTS_FILE, check_tokenizer_fits,
                             claim_output_dir, find_tokenizer_dir, mark_output_dir, resolve_model_dir)
from groundup.quant.load import load_model
from groundup.tokenizer import load_tokenizer

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def export_hf(checkpoint: str | Path, out: str | Path, dtype: str | None = None, overwrite: bool = False) -> str:
    """Write the Hugging Face directory; returns the architecture chosen (e.g. "llama")."""

    model_dir = resolve_model_dir(checkpoint)
    # A run directory's checkpoints live two levels below it: protect the run, not only the step.
    claim_output_dir(out, "export hf", overwrite=overwrite, sources=[Path(checkpoint), model_dir])
    tok_dir = find_tokenizer_dir(model_dir)
    if tok_dir is None:
        raise CheckpointError(f"{model_dir}: no tokenizer beside the checkpoint (MODEL/tokenizer or RUN/tokenizer); "
                              "a Hugging Face directory needs one")
    tok = load_tokenizer(tok_dir)
    model = load_model(model_dir, dtype=resolve_dtype(dtype) if dtype else None)
    cfg = model.cfg
    check_tokenizer_fits(tok.vocab_size, cfg.vocab_size, tok_dir, model_dir)
    arch = choose_architecture(cfg, expert_bias_is_zero=all(not m.expert_bias.any() for m in model.moe_layers()))
    weights = to_hf_state(arch, cfg, model.state_dict())
    ids = {"bos": tok.bos_id, "eot": tok.eot_id, "pad": tok.pad_id}
    config = hf_config(arch, cfg, ids, DTYPE_NAMES[model.embed.weight.dtype])
    with atomic_dir(out) as tmp:
        mark_output_dir(tmp, "export hf")
        save_file(weights, str(tmp / HF_WEIGHTS_FILE), metadata={"format": "pt"})
        follow_umask(tmp / HF_WEIGHTS_FILE)
        atomic_write_json(tmp / HF_CONFIG_FILE, config)
        write_tokenizer_files(tok, tmp, cfg.max_seq_len)
        # After the tokenizer: a Hugging Face tokenizer directory may carry its own generation_config.json.
        atomic_write_json(tmp / HF_GENERATION_CONFIG_FILE, {
            "bos_token_id": tok.bos_id, "eos_token_id": sorted(tok.stop_ids), "pad_token_id": tok.pad_id})
    return arch
