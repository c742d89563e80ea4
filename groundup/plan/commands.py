"""`groundup plan`: memory per GPU, the largest micro-batch that fits, time and GPU hours of a run.

    groundup plan --config configs/plan-clover-12b.toml --gpus 8 --gpu a100-80gb
    groundup plan --config configs/train-ladder-1b-fsdp.toml --gpus 64 --gpu h100 --tokens 1T --json
    groundup plan --config run.toml --gpus 16 --tp 4 --sequence-parallel train.batch_size=4
"""

from __future__ import annotations

import argparse
import json
import math

from groundup.arguments import add_config_arguments

_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def token_count(text: str) -> float:
    """1e12, 300B, 1.5T, 2M: a positive, finite number of tokens (nan, inf and 0 are refused)."""
    text = text.strip().replace("_", "").replace(",", "")
    scale = _SUFFIXES.get(text[-1:].upper(), 0)
    try:
        count = float(text[:-1]) * scale if scale else float(text)
    except ValueError:
        count = math.nan
    if not (math.isfinite(count) and count > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of tokens, e.g. 1e12, 300B or 1.5T")
    return count


def plan_arguments(p: argparse.ArgumentParser) -> None:
    from groundup.plan.gpus import GPUS
    from groundup.plan.memory import ACCUMULATION

    p.add_argument("--gpus", type=int, default=8, help="GPUs in all (default 8)")
    p.add_argument("--gpu", default="a100-80gb", help=f"GPU model: {', '.join(GPUS)} (default a100-80gb)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node: the hybrid row shards within one")
    p.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel degree of the FSDP + TP row (default: the largest of 8, 4, 2 within a node "
                        "that divides the heads and leaves FSDP at least 2 ranks)")
    p.add_argument("--sequence-parallel", action="store_true", help="TP row: norms and residuals split by sequence")
    p.add_argument("--tokens", type=token_count, default=None,
                   help="tokens to train on, e.g. 1e12 or 300B (default: train.max_steps steps)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation to assume (default 0.4)")
    p.add_argument("--headroom", type=float, default=0.1,
                   help="share of GPU memory kept free for the CUDA context, NCCL and fragmentation (default 0.1)")
    p.add_argument("--fsdp-accumulate", default=None,
                   help="how FSDP accumulates gradients over micro-batches (default: what the config's "
                        "distributed.fsdp_grad_sync does): " +
                        "; ".join(f"{k}: {v}" for k, v in ACCUMULATION.items()))
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    add_config_arguments(p, "groundup.train.config:TrainConfig", "train.batch_size=4")


def plan(args: argparse.Namespace) -> int:
    from groundup.config import load_config
    from groundup.plan.estimate import plan as make_plan
    from groundup.plan.report import format_plan
    from groundup.train.config import TrainConfig

    cfg = load_config(TrainConfig, args.config, args.overrides)
    result = make_plan(cfg, args.gpus, args.gpu, args.tokens, args.mfu, gpus_per_node=args.gpus_per_node, tp=args.tp,
                       sequence_parallel=args.sequence_parallel, headroom=args.headroom,
                       fsdp_accumulate=args.fsdp_accumulate)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_plan(result))
    return 0
