"""Hugging Face interop: export a checkpoint to a transformers model directory, import one back.

    from groundup.interop import export_hf, import_hf
    export_hf("out/model", "out/hf")          # -> "llama", "qwen3", "gemma2", "mixtral", ...
    import_hf("out/hf", "out/model-again")    # exact round trip
"""

from groundup.interop.export import export_hf
from groundup.interop.hf_import import import_hf

__all__ = ["export_hf", "import_hf"]
