"""`groundup demo` and `groundup report`."""

from __future__ import annotations

import argparse
from pathlib import Path

from groundup.arguments import add_config_arguments


def demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("groundup-demo"), help="output directory (groundup-demo)")
    p.add_argument("--budget-minutes", type=float, default=None, help="end-to-end time budget (15)")
    p.add_argument("--fresh", action="store_true", help="rerun every stage instead of reusing finished ones")
    add_config_arguments(p, "groundup.demo.config:DemoConfig", "pretrain.optim.name=muon")


def demo(args: argparse.Namespace) -> None:
    from groundup.config import load_config
    from groundup.demo import DemoConfig, run_demo

    extra = [f"budget_minutes={args.budget_minutes}"] if args.budget_minutes is not None else []
    cfg = load_config(DemoConfig, args.config, [*args.overrides, *extra])
    run_demo(cfg, args.out, fresh=args.fresh)


def report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a demo directory or a `groundup train` run directory")
    p.add_argument("--overwrite", action="store_true", help="replace a report.md that 'groundup report' did not write")


def report(args: argparse.Namespace) -> None:
    from groundup.errors import GroundupError
    from groundup.report import write_report

    if not args.run_dir.is_dir():
        raise GroundupError(f"{args.run_dir}: no such directory")
    path = write_report(args.run_dir, overwrite=args.overwrite)
    print(path)
