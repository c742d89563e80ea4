"""`groundup sft` and `groundup merge`.

    groundup sft --base out/model --data chat/chat-math.jsonl --out runs/sft [lora.rank=16 ...]
    groundup sft --resume runs/sft
    groundup merge --base out/model --adapter runs/sft --out out/model-sft
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _run_arguments(p: argparse.ArgumentParser, config: str) -> None:
    p.add_argument("--config", type=Path, default=None, help=f"TOML file of {config} sections")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="new run directory (refused if it already holds a run)")
    where.add_argument("--resume", type=Path, metavar="RUN", help="continue RUN from its newest intact checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", help="section.key=value over the config, e.g. lora.rank=16")


def sft_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", default=None, help="the model to fine-tune: a model or run directory, an imported model")
    p.add_argument("--data", nargs="+", type=Path, default=None, help="JSONL/Parquet files: messages, prompt/"
                   "completion, text, ShareGPT conversations or Alpaca instruction/output records")
    p.add_argument("--eval-data", nargs="+", type=Path, default=None, help="held-out files (default: records whose "
                   "split is 'heldout', else sft.val_fraction of the data)")
    _run_arguments(p, "SFTConfig")


def _paths(key: str, paths) -> list[str]:
    import json

    return [f"{key}={json.dumps([str(x) for x in paths])}"] if paths else []


def sft(args: argparse.Namespace) -> int:
    from groundup.config import inputs_and_overrides
    from groundup.posttrain.config import SFTConfig
    from groundup.posttrain.sft import sft as run_sft
    from groundup.train.commands import load_run_config, print_summary

    data, moved = inputs_and_overrides(args.data or [])
    args.overrides = moved + list(args.overrides)
    extra = _paths("sft.data", data) + _paths("sft.eval_data", args.eval_data)
    extra += [f"base={__import__('json').dumps(args.base)}"] if args.base else []
    cfg = load_run_config(SFTConfig, args, extra)
    return print_summary(run_sft(cfg, args.resume or args.out, resume=args.resume is not None), "sft")


def merge_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", default=None, help="the base model (default: the one the adapter names)")
    p.add_argument("--adapter", required=True, type=Path, help="an adapter directory or a LoRA run")
    p.add_argument("--out", required=True, type=Path, help="the merged model directory to write")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")


def merge(args: argparse.Namespace) -> int:
    from groundup.posttrain.merge import merge_adapter

    out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype, overwrite=args.overwrite)
    print(f"wrote {out}: the base with the adapter folded in (generate, chat, eval and export read it)")
    return 0
