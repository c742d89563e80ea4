"""`groundup train`: start a run or resume one; the same command under torchrun trains in parallel.

    groundup train --config configs/train-tiny.toml data.shards=out/tokens --out runs/tiny
    groundup train --resume runs/tiny [train.max_steps=2000 ...]
    torchrun --nproc-per-node 8 -m groundup train --config run.toml --out runs/big distributed.strategy=fsdp
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path


def train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="TOML file of TrainConfig sections (configs/train-*.toml)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="new run directory (refused if it already holds a run)")
    where.add_argument("--resume", type=Path, metavar="RUN", help="continue RUN from its newest intact checkpoint "
                       "(its config.toml, or --config, then the overrides; changes that would make the "
                       "checkpoint meaningless are refused, naming the keys)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", help="section.key=value over the config, e.g. train.max_steps=500")


def load_run_config(cls, args: argparse.Namespace, extra: list[str] = ()):
    """The config of a fresh run (defaults, --config, overrides) or of a resumed one (its config.toml,
    or --config, then the overrides)."""
    from groundup.config import load_config
    from groundup.errors import CheckpointError
    from groundup.layout import RUN_CONFIG_FILE

    overrides = list(extra) + list(args.overrides) + (["log.progress=false"] if args.quiet else [])
    if args.resume is not None:
        base = args.config or args.resume / RUN_CONFIG_FILE
        if not base.is_file():
            raise CheckpointError(f"{args.resume}: no {RUN_CONFIG_FILE}, so not a run directory to resume")
        return load_config(cls, base, overrides)
    return load_config(cls, args.config, overrides)


def print_summary(summary: dict, verb: str = "train") -> int:
    """The closing lines of a training verb; the exit code (128 + signal when interrupted)."""
    if os.environ.get("RANK", "0") != "0":  # under torchrun the main process reports
        return 0
    val = ""
    if summary.get("val_bpb") is not None:
        val = f", val loss {summary['val_loss']:.4f}, val bpb {summary['val_bpb']:.4f}"
    elif summary.get("eval"):
        val = "".join(f", {k} {v:.4f}" for k, v in summary["eval"].items() if isinstance(v, float))
    print(f"{summary['run_dir']}: {summary['steps']} steps, {summary['tokens']:,} tokens, train loss "
          f"{summary['train_loss']:.4f}{val}; {summary['tokens_per_sec']:,.0f} tokens/s, MFU {summary['mfu']:.1%}, "
          f"{summary['wall_time_s']:.0f} s")
    if summary["skipped_steps"] or summary["gated_sequences"] or summary["rollbacks"]:
        print(f"  stability: {summary['skipped_steps']} skipped steps, {summary['gated_sequences']} sequences "
              f"dropped by the data gate, {summary['rollbacks']} rollbacks")
    if summary["interrupted"]:
        print(f"  interrupted by {summary['interrupted']}: resume with 'groundup {verb} --resume {summary['run_dir']}'")
        signum = getattr(signal, summary["interrupted"], None)
        return 128 + int(signum) if signum else 1
    return 0


def train(args: argparse.Namespace) -> int:
    from groundup.train.config import TrainConfig
    from groundup.train.pretrain import train as run_training

    cfg = load_run_config(TrainConfig, args)
    summary = run_training(cfg, args.resume or args.out, resume=args.resume is not None)
    return print_summary(summary, "train")
