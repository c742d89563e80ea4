"""`groundup export hf` and `groundup import hf`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def export_hf_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a model directory or a training run directory")
    p.add_argument("--out", required=True, type=Path, help="the Hugging Face directory to write")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: as stored)")


def export_hf(args: argparse.Namespace) -> int:
    from groundup.interop.export import export_hf as run

    arch = run(args.checkpoint, args.out, args.dtype)
    print(f"wrote {args.out} ({arch}); load it with transformers.AutoModelForCausalLM.from_pretrained("
          f"{str(args.out)!r}) and AutoTokenizer.from_pretrained(...)")
    return 0


def import_hf_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, type=Path, help="a local Hugging Face model directory")
    p.add_argument("--out", required=True, type=Path, help="the groundup model directory to write")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: as stored)")


def import_hf(args: argparse.Namespace) -> int:
    from groundup.interop.hf_import import import_hf as run

    arch, no_tokenizer = run(args.model, args.out, args.dtype)
    print(f"wrote {args.out} from a {arch} model")
    if no_tokenizer:
        print(f"note: no tokenizer copied ({no_tokenizer}); generate and chat need --tokenizer DIR", file=sys.stderr)
    return 0
