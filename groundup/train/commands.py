"""`groundup train`: start a run or resume one; the same command under torchrun trains in parallel.

    groundup train --config configs/train-tiny.toml data.shards=out/tokens --out runs/tiny
    groundup train --resume runs/tiny [train.max_steps=2000 ...]     # or --out runs/tiny --resume
    torchrun --nproc-per-node 8 -m groundup train --config run.toml --out runs/big distributed.strategy=fsdp
"""

from __future__ import annotations

import argparse
import os
import signal

from groundup.arguments import add_config_arguments, add_output_arguments, add_progress_argument, resolve_output


def train_arguments(p: argparse.ArgumentParser) -> None:
    add_output_arguments(p)
    add_progress_argument(p)
    add_config_arguments(p, "groundup.train.config:TrainConfig", "train.max_steps=500")


def load_run_config(cls, args: argparse.Namespace, extra: list[str] = ()):
    """The config of a fresh run (defaults, --config, overrides) or of a resumed one (its config.toml,
    or --config, then the overrides). Sets args.run_dir and args.resuming."""
    from groundup.config import apply_overrides, load_config, read_toml, saved_config
    from groundup.errors import CheckpointError
    from groundup.layout import RUN_CONFIG_FILE, claim_output_dir

    args.run_dir, args.resuming = resolve_output(args)
    overrides = list(extra) + list(args.overrides) + (["log.progress=false"] if args.quiet else [])
    if args.resuming:
        claim_output_dir(args.run_dir, cls.verb, resume=True)  # another verb's run: refused before its config is read
        if args.config is not None:
            return load_config(cls, args.config, overrides)
        saved = args.run_dir / RUN_CONFIG_FILE
        if not saved.is_file():
            raise CheckpointError(f"{args.run_dir}: no {RUN_CONFIG_FILE}, so not a training run directory to resume")
        return saved_config(cls, apply_overrides(read_toml(saved), overrides))
    return load_config(cls, args.config, overrides)


def print_summary(summary: dict, verb: str = "train") -> int:
    """The closing lines of a training verb; the exit code (128 + signal when interrupted)."""
    if os.environ.get("RANK", "0") != "0":  # under torchrun the main process reports
        return 0
    from groundup.train.metrics import describe_utilization

    val = ""
    if summary.get("val_bpb") is not None:
        val = f", val loss {summary['val_loss']:.4f}, val bpb {summary['val_bpb']:.4f}"
    elif summary.get("eval"):
        val = "".join(f", {k} {v:.4f}" for k, v in summary["eval"].items() if isinstance(v, float))
    print(f"{summary['run_dir']}: {summary['steps']} steps, {summary['tokens']:,} tokens, train loss "
          f"{summary['train_loss']:.4f}{val}; {summary['tokens_per_sec']:,.0f} tokens/s, "
          f"{describe_utilization(summary)}, {summary['wall_time_s']:.0f} s")
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
    return print_summary(run_training(cfg, args.run_dir, resume=args.resuming), "train")
