"""`groundup data curate` and `groundup data train-classifier`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from groundup.arguments import add_config_arguments, add_progress_argument
from groundup.layout import claim_output_file, claim_output_dir


def curate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, nargs="+", type=Path, metavar="PATH",
                   help=".txt/.md/.jsonl(.gz/.zst)/.parquet files or directories (source code by extension)")
    p.add_argument("--out", required=True, type=Path, help="output directory: shards/, report.json, report.md")
    p.add_argument("--workers", type=int, default=None,
                   help="processes curating shards in parallel (workers=; --executor local)")
    executor_arguments(p)
    add_progress_argument(p)
    add_config_arguments(p, "groundup.data.curate_config:CurateConfig", "dedup.minhash.threshold=0.7")


def executor_arguments(p: argparse.ArgumentParser) -> None:
    """--executor and --address, shared by `data curate` and `data tokenize`."""
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local: processes on this machine; ray: one Ray task per input file, on a cluster "
                        "(needs groundup[ray]; every node must see --input and --out at the same paths)")
    p.add_argument("--address", default=None, metavar="ADDRESS",
                   help="with --executor ray: the cluster, as auto, HOST:PORT or ray://HOST:PORT "
                        "(default: a Ray instance started on this machine for the run)")


def curate(args: argparse.Namespace, checkpoint_scorer: Callable | None = None) -> None:
    """`checkpoint_scorer(path, device, batch_size)` builds the bits-per-byte scorer `perplexity.checkpoint`
    needs: scoring with a model sits above this layer, so eval/data_commands.py passes it in."""
    from groundup.config import inputs_and_overrides, load_config
    from groundup.data.curate_config import CurateConfig
    from groundup.data.pipeline import curate as run
    from groundup.data.readers import PROBLEM_KINDS, ReadStats

    inputs, moved = inputs_and_overrides(args.input)
    overrides = moved + list(args.overrides) + ([f"workers={args.workers}"] if args.workers is not None else [])
    cfg = load_config(CurateConfig, args.config, overrides)
    claim_output_dir(args.out, "data curate")  # the pipeline marks it once its executor runs
    scorer = None
    if cfg.perplexity.enabled and cfg.perplexity.checkpoint and checkpoint_scorer is not None:
        scorer = checkpoint_scorer(cfg.perplexity.checkpoint, cfg.perplexity.device, cfg.perplexity.batch_size)
    report = run(inputs, args.out, cfg, progress=not args.quiet, executor=args.executor, address=args.address,
                 checkpoint_scorer=scorer)
    t, tm = report["totals"], report["timing"]
    print(f"{t['docs_in']:,} documents ({t['bytes_in'] / 1e6:.1f} MB) in, {t['docs_kept']:,} kept, "
          f"{t['docs_out']:,} ({t['bytes_out'] / 1e6:.1f} MB) written in {tm['total_s']:.1f} s")
    for stage in report["stages"]:
        if stage["removed_docs"]:
            print(f"  {stage['name']:<24} removed {stage['removed_docs']:>7,} documents "
                  f"({stage['removed_bytes'] / 1e6:.1f} MB) from {', '.join(stage['applies_to'])}")
    read = report["read"]
    if any(read.get(k) for k in PROBLEM_KINDS) or (read.get("crawl") or {}).get("positions"):
        stats = ReadStats(**read)
        print(f"  read problems (skipped and counted): {stats.summary()}")
        for example in stats.examples(5):
            print(f"    {example}")
    for note in report["mix"].get("notes", []):
        print(f"  mixing: {note}")
    if t["docs_out"] == 0:
        print("  warning: no document was written; report.md shows which stage removed them")
    else:
        mix = ", ".join(f"{d} {100 * c['share']:.1f}%" for d, c in report["mix"]["output"].items())
        print(f"  mix (bytes out): {mix}")
    print(f"{args.out / 'shards'}/, {args.out / 'report.md'}")


def train_classifier_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--positive", required=True, nargs="+", type=Path, metavar="PATH", help="examples of good text")
    p.add_argument("--negative", required=True, nargs="+", type=Path, metavar="PATH", help="examples of bad text")
    p.add_argument("--out", required=True, type=Path, help="model file (.npz) for classifier.model=")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--bits", type=int, default=20, help="2^bits hashed feature buckets")
    p.add_argument("--max-docs", type=int, default=None, help="at most this many documents per class")
    p.add_argument("--seed", type=int, default=0)


def train_classifier(args: argparse.Namespace) -> None:
    from groundup.data.classifier import FeatureSpec, train
    from groundup.data.readers import iter_records
    from groundup.errors import DataError

    if not 8 <= args.bits <= 26:
        raise DataError(f"--bits {args.bits}: expected 8..26")
    claim_output_file(args.out, "data train-classifier", "model file (.npz)")

    def texts(paths: list[Path]) -> list[str]:
        out = []
        for record in iter_records(paths):
            if record["text"].strip():
                out.append(record["text"])
                if args.max_docs and len(out) >= args.max_docs:
                    break
        return out

    model = train(texts(args.positive), texts(args.negative), FeatureSpec(bits=args.bits), epochs=args.epochs,
                  lr=args.lr, seed=args.seed)
    model.save(args.out)
    m = model.metrics
    print(f"trained on {m['train_docs']:,} of {m['positive'] + m['negative']:,} documents "
          f"({m['positive']:,} positive, {m['negative']:,} negative)")
    if "heldout_accuracy" in m:
        print(f"held-out ({m['heldout_docs']:,} documents): accuracy {m['heldout_accuracy']:.3f}, AUC {m['heldout_auc']:.3f}")
    print(f"{args.out}: use with classifier.model={args.out}")
