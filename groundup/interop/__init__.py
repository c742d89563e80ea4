"""Interop: Hugging Face export and import, and GGUF (llama.cpp) import.

    from groundup.interop import export_hf, import_hf, import_gguf
    export_hf("out/model", "out/hf")                  # -> "llama", "qwen2", "qwen3", "gemma2", "mixtral", ...
    import_hf("out/hf", "out/model-again")            # exact round trip; a Hugging Face tokenizer comes along
    import_gguf("model-Q8_0.gguf", "out/from-gguf")   # llama / qwen2 / qwen3, dequantized, with its tokenizer

Every verb refuses an existing non-empty output directory unless `overwrite=True` (see out_dir).
"""

from groundup.interop.export import export_hf
from groundup.interop.gguf_import import import_gguf
from groundup.interop.hf_import import import_hf

__all__ = ["export_hf", "import_gguf", "import_hf"]
