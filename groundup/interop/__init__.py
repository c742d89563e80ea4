"""Interop: Hugging Face export and import, GGUF (llama.cpp) export and import, and LoRA adapters in peft's layout.

    from groundup.interop import export_hf, import_hf, import_gguf
    export_hf("out/model", "out/hf")                  # -> "llama", "qwen2", "qwen3", "gemma2", "mixtral", ...
    import_hf("out/hf", "out/model-again")            # exact round trip; a Hugging Face tokenizer comes along
    import_gguf("model-Q8_0.gguf", "out/from-gguf")   # llama / qwen2 / qwen3, dequantized, with its tokenizer

    export.py            export_hf: a model as a Hugging Face directory (config, weights, tokenizer, generation config)
    hf_config.py         which Hugging Face architecture computes exactly what a ModelConfig does, and its config.json
    hf_import_config.py  a Hugging Face config.json back into a ModelConfig, anything unreproducible refused
    hf_weights.py        the tensor name and layout table between groundup and Hugging Face, read both ways
    hf_tokenizer.py      a model's tokenizer files for a Hugging Face directory, from either tokenizer backend
    hf_import.py         import_hf: a local Hugging Face directory (safetensors only) as a groundup model directory
    gguf_export.py       export_gguf: a model as one llama.cpp GGUF file (f32, f16, q8_0, q4_0) with its tokenizer
    gguf_import.py       import_gguf: a GGUF file dequantized into a groundup model directory
    gguf_tokenizer.py    the tokenizer in a GGUF file's metadata rebuilt as Hugging Face tokenizer files
    peft_format.py       LoRA adapters in peft's layout, saved and loaded both ways
    commands.py          `groundup export hf|gguf` and `groundup import hf|gguf`

Every verb refuses an existing non-empty output directory unless `overwrite=True` (see out_dir).
"""

from groundup.interop.export import export_hf
from groundup.interop.gguf_import import import_gguf
from groundup.interop.hf_import import import_hf

__all__ = ["export_hf", "import_gguf", "import_hf"]
