"""`groundup data tokenize`: text records in, token shards with a train/val split out.

    groundup data tokenize --tokenizer out/tokenizer --input out/curated/shards --out out/tokens
"""

from __future__ import annotations

import argparse
from pathlib import Path

from groundup.arguments import add_config_arguments, add_progress_argument
from groundup.config import load_cli_config
from groundup.data.commands import executor_arguments
from groundup.layout import claim_output_dir


def tokenize_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True, type=Path, help="tokenizer directory (groundup tokenizer train)")
    p.add_argument("--input", required=True, nargs="+", type=Path, help="files or directories of text records")
    p.add_argument("--out", required=True, type=Path, help="directory for index.json, train/ and val/")
    p.add_argument("--val-fraction", type=float, default=None, help="share of documents for validation (0.01)")
    p.add_argument("--workers", type=int, default=None,
                   help="encoding processes (default: one per core; --executor local)")
    executor_arguments(p)
    add_progress_argument(p)
    add_config_arguments(p, "groundup.tokens.shards:TokenizeConfig", "shard_tokens=1000000")


def tokenize(args: argparse.Namespace) -> None:
    from groundup.data.readers import ReadStats
    from groundup.tokens.shards import SPLITS, TokenizeConfig, tokenize_to_shards

    cfg = load_cli_config(TokenizeConfig, args, val_fraction=args.val_fraction, workers=args.workers)
    claim_output_dir(args.out, "data tokenize")  # marked once the executor runs
    index = tokenize_to_shards(args.input, args.tokenizer, args.out, cfg, progress=not args.quiet,
                               executor=args.executor, address=args.address)
    mb = index["bytes"] / 1e6
    print(f"{args.out}: {index['tokens']:,} tokens ({index['dtype']}) from {index['documents']:,} documents, "
          f"{mb:.1f} MB of text in {index['seconds']:.1f} s ({mb / max(index['seconds'], 1e-9):.1f} MB/s)")
    for split in SPLITS:
        info = index["splits"][split]
        domains = ", ".join(f"{d} {c['tokens']:,}" for d, c in sorted(info["domains"].items()))
        print(f"  {split}: {info['documents']:,} documents, {info['tokens']:,} tokens ({domains})")
    if index["skipped_empty"]:
        print(f"  skipped {index['skipped_empty']:,} records with empty text")
    read = ReadStats(**index["read"])
    examples = read.bad_json_examples + read.no_text_examples + read.invalid_utf8_examples + read.too_long_examples
    print(f"  read: {read.summary()}" + "".join(f"\n    {e}" for e in examples[:3]))
