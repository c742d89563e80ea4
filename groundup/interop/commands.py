"""`groundup export hf`, `groundup export gguf`, `groundup import hf` and `groundup import gguf`.

Each refuses an --out that exists and is not empty unless --overwrite is given, and a folder another verb
made (the directories through groundup.layout.claim_output_dir; `export gguf` writes one file, which it
replaces only with --overwrite).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from groundup.arguments import add_model_argument

OVERWRITE_HELP = "replace --out if it exists and is not empty (never the model being read)"


def export_hf_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p, help="a model directory or a training run directory")
    p.add_argument("--out", required=True, type=Path, help="the Hugging Face directory to write")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: as stored)")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def export_hf(args: argparse.Namespace) -> int:
    from groundup.interop.export import export_hf as run

    arch = run(args.model, args.out, args.dtype, overwrite=args.overwrite)
    print(f"wrote {args.out} ({arch}); load it with transformers.AutoModelForCausalLM.from_pretrained("
          f"{str(args.out)!r}) and AutoTokenizer.from_pretrained(...)")
    return 0


def export_gguf_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p, help="a model directory (also a quantized one) or a training run")
    p.add_argument("--type", default=None, help="f32, f16, q8_0 or q4_0 (default: f16; f32 for a quantized model, "
                   "its exact form)")
    p.add_argument("--out", required=True, type=Path, help="the .gguf file to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def export_gguf(args: argparse.Namespace) -> int:
    from groundup.interop.gguf_export import export_gguf as run

    report = run(args.model, args.out, args.type, overwrite=args.overwrite)
    size = report.path.stat().st_size
    print(f"wrote {report.path} ({report.arch}, {report.type}, {report.tensors} tensors, {size / 1e6:.1f} MB, "
          f"tokenizer.ggml.pre = {report.pre!r}); run it with llama.cpp: llama-cli -m {report.path}")
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def import_hf_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, type=Path, help="a local Hugging Face model directory")
    p.add_argument("--out", required=True, type=Path, help="the groundup model directory to write")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: as stored)")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def _report(out: Path, source: str, no_tokenizer: str | None) -> None:
    print(f"wrote {out} from {source}")
    if no_tokenizer:
        print(f"note: no tokenizer copied ({no_tokenizer}); generate and chat need --tokenizer DIR", file=sys.stderr)


def import_hf(args: argparse.Namespace) -> int:
    from groundup.interop.hf_import import import_hf as run

    arch, no_tokenizer = run(args.model, args.out, args.dtype, overwrite=args.overwrite)
    _report(args.out, f"a {arch} model", no_tokenizer)
    return 0


def import_gguf_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, help="a llama.cpp GGUF file (architecture llama, qwen2 or qwen3)")
    p.add_argument("--out", required=True, type=Path, help="the groundup model directory to write")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32, or float16 / "
                   "bfloat16 when every matrix is stored so)")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def import_gguf(args: argparse.Namespace) -> int:
    from groundup.interop.gguf_import import import_gguf as run

    arch, no_tokenizer = run(args.file, args.out, args.dtype, overwrite=args.overwrite)
    _report(args.out, f"a GGUF {arch} model", no_tokenizer)
    return 0
