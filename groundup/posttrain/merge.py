"""`merge_adapter`: a LoRA adapter folded into its base, written as an ordinary model directory.

The merged model computes what base + adapter computes (logits equal within 1e-5, tested) and needs
no adapter support anywhere: generate, chat, eval, serve, export hf and quantize all read it.
"""

from __future__ import annotations

from pathlib import Path

from groundup.device import resolve_dtype
from groundup.io import atomic_dir
from groundup.layout import TOKENIZER_DIR, claim_output_dir, mark_output_dir
from groundup.loading import load_for_inference
from groundup.model.model_dir import save_model


def merge_adapter(adapter: str | Path, out: str | Path, base: str | Path | None = None, dtype: str | None = None,
                  overwrite: bool = False) -> Path:
    """Load `base` (default: the base the adapter names) with `adapter`, merge, save to `out`."""
    sources = [adapter] + ([base] if base else [])
    out = claim_output_dir(out, "merge-lora", overwrite=overwrite, sources=sources)
    if base is None:
        model, tok = load_for_inference(adapter, device="cpu", dtype="float32", merge=True)
    else:
        model, tok = load_for_inference(base, device="cpu", dtype="float32", adapter=adapter, merge=True)
    if dtype:
        model.to(resolve_dtype(dtype))
        model.reset_buffers()
    with atomic_dir(out) as tmp:
        mark_output_dir(tmp, "merge-lora")
        save_model(model, tmp, metadata={"merged_adapter": str(Path(adapter).resolve())})
        tok.save(tmp / TOKENIZER_DIR)
    return Path(out)
