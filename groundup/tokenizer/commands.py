"""`groundup tokenizer train` and `groundup tokenizer stats`.

    groundup tokenizer train --input out/curated/shards --vocab-size 8192 --out out/tokenizer
    groundup tokenizer stats --tokenizer out/tokenizer --input heldout.jsonl

`train` keeps a deterministic share of documents out of training (`holdout_fraction`, chosen by the
same text hash as `data tokenize`'s validation split, so with equal fraction and seed the held-out
documents are exactly the validation documents) and reports bytes per token on them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Iterator

from groundup.arguments import add_config_arguments, add_progress_argument
from groundup.config import load_cli_config
from groundup.errors import DataError
from groundup.io import atomic_write_json
from groundup.layout import claim_output_dir

HELDOUT_LIMIT = 32 << 20  # held-out text kept in memory for the end-of-training statistics


def train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, nargs="+", type=Path, help="files or directories of text records")
    p.add_argument("--out", required=True, type=Path, help="directory for tokenizer.json and its metadata")
    p.add_argument("--vocab-size", type=int, default=None, help="tokens including 256 bytes and 7 specials (32768)")
    add_progress_argument(p)
    add_config_arguments(p, "groundup.tokenizer.train:TokenizerConfig", "digit_group=2")


def train(args: argparse.Namespace) -> None:
    from groundup.data.readers import ReadStats, iter_records
    from groundup.data.hashing import record_score
    from groundup.data.output import record_field
    from groundup.tokenizer.stats import format_stats, tokenizer_stats
    from groundup.tokenizer.train import TokenizerConfig, train_tokenizer

    cfg = load_cli_config(TokenizerConfig, args, vocab_size=args.vocab_size)
    scale = cfg.holdout_fraction / (cfg.holdout_group_fraction or cfg.holdout_fraction or 1.0)
    out = claim_output_dir(args.out, "tokenizer train", mark=True)
    stats, heldout = ReadStats(), []
    held = {"bytes": 0, "documents": 0}

    def texts() -> Iterator[str]:
        for record in iter_records(args.input, stats):
            text = record["text"]
            group = record_field(record, cfg.holdout_group) if cfg.holdout_group else None
            if cfg.holdout_fraction and record_score(text, cfg.seed, group, scale) < cfg.holdout_fraction:
                held["documents"] += 1
                if held["bytes"] < HELDOUT_LIMIT:
                    heldout.append(record)
                    held["bytes"] += len(text)
                continue
            yield text

    start = time.perf_counter()
    tok = train_tokenizer(texts(), cfg, progress=not args.quiet)
    seconds = time.perf_counter() - start
    tok.meta["trained"].update(inputs=[str(p) for p in args.input], read=stats.to_dict(),
                               heldout_documents=held["documents"], total_seconds=round(seconds, 3))
    report = tokenizer_stats(tok, heldout) if heldout else None
    tok.meta["heldout_stats"] = report
    tok.save(out)
    trained = tok.meta["trained"]
    print(f"{out}: vocabulary {tok.vocab_size:,} (requested {cfg.vocab_size:,}), hash {tok.hash}; trained on "
          f"{trained['documents']:,} documents, {trained['bytes'] / 1e6:.1f} MB in {seconds:.1f} s")
    if tok.vocab_size < cfg.vocab_size:
        print(f"  note: the input has too few distinct pairs (min_frequency {cfg.min_frequency}) for "
              f"{cfg.vocab_size:,} tokens; {trained['dropped_tokens']} learned tokens were unreachable")
    print(f"  read: {stats.summary()}")
    if report:
        print(f"held-out documents ({held['documents']:,}):\n{format_stats(report)}")


def stats_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True, type=Path,
                   help="tokenizer directory or tokenizer.json (groundup's or any Hugging Face one)")
    p.add_argument("--input", required=True, nargs="+", type=Path, help="held-out text records")
    p.add_argument("--heldout-only", action="store_true",
                   help="measure only the documents 'tokenizer train' held out (when --input is the training input)")
    p.add_argument("--longest", type=int, default=10, help="how many of the longest tokens to list")
    p.add_argument("--json", type=Path, default=None, help="also write the statistics to this JSON file")


def stats(args: argparse.Namespace) -> None:
    from groundup.data.readers import ReadStats, iter_records
    from groundup.data.hashing import record_score
    from groundup.data.output import record_field
    from groundup.tokenizer import load_tokenizer
    from groundup.tokenizer.stats import format_stats, tokenizer_stats

    tok = load_tokenizer(args.tokenizer)
    read = ReadStats()
    records = iter_records(args.input, read)
    if args.heldout_only:
        trained = getattr(tok, "meta", {}).get("trained") or {}
        if not trained.get("holdout_fraction"):
            raise DataError(f"{args.tokenizer}: no held-out documents recorded (trained with holdout_fraction 0 "
                            "or not by 'groundup tokenizer train')")
        fraction, seed = trained["holdout_fraction"], trained.get("seed", 0)
        field = trained.get("holdout_group") or ""
        scale = fraction / (trained.get("holdout_group_fraction") or fraction)
        records = (r for r in records
                   if record_score(r["text"], seed, record_field(r, field) if field else None, scale) < fraction)
    report = tokenizer_stats(tok, records, longest=args.longest)
    if not report["total"]["documents"]:
        raise DataError(f"no documents to measure in {', '.join(map(str, args.input))}")
    print(f"{args.tokenizer} (hash {tok.hash}) on {', '.join(map(str, args.input))}\n{format_stats(report)}")
    print(f"read: {read.summary()}")
    if args.json:
        atomic_write_json(args.json, {**report, "read": read.to_dict()})
