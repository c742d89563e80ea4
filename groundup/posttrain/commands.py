"""The post-training verbs: `sft`, `dpo`, `kto`, `grpo`, `rft`, `rm`, and `merge`.

    groundup sft --base out/model --data chat/chat-math.jsonl --out runs/sft [lora.rank=16 ...]
    groundup dpo --base runs/sft --data pairs.jsonl --out runs/dpo dpo.beta=0.1
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
    _data_arguments(p, "JSONL/Parquet files: messages, prompt/completion, text, ShareGPT conversations or Alpaca "
                       "instruction/output records", "SFTConfig")


def _paths(key: str, paths) -> list[str]:
    import json

    return [f"{key}={json.dumps([str(x) for x in paths])}"] if paths else []


def sft(args: argparse.Namespace) -> int:
    from groundup.posttrain.config import SFTConfig
    from groundup.posttrain.sft import sft as run_sft
    from groundup.train.commands import print_summary

    cfg = _stage_config(SFTConfig, "sft", args)
    return print_summary(run_sft(cfg, args.resume or args.out, resume=args.resume is not None), "sft")


def _data_arguments(p: argparse.ArgumentParser, what: str, config: str) -> None:
    p.add_argument("--base", default=None, help="the model to train: a model or run directory (an SFT run), an "
                   "imported model")
    p.add_argument("--data", nargs="+", type=Path, default=None, help=what)
    p.add_argument("--eval-data", nargs="+", type=Path, default=None, help="held-out files (default: records whose "
                   "split is 'heldout', else val_fraction of the data)")
    _run_arguments(p, config)


def _stage_config(cls, section: str, args: argparse.Namespace, data_key: str = "data", eval_key: str = "eval_data"):
    import json

    from groundup.config import inputs_and_overrides
    from groundup.train.commands import load_run_config

    # an nargs="+" list swallows the overrides that follow it (`--eval-data h.jsonl train.seq_len=128`)
    data, moved = inputs_and_overrides(args.data or [])
    held, moved_held = inputs_and_overrides(getattr(args, "eval_data", None) or [])
    args.overrides = moved + moved_held + list(args.overrides)
    extra = _paths(f"{section}.{data_key}", data) + _paths(f"{section}.{eval_key}", held)
    extra += [f"base={json.dumps(args.base)}"] if args.base else []
    return load_run_config(cls, args, extra)


def dpo_arguments(p: argparse.ArgumentParser) -> None:
    _data_arguments(p, "JSONL/Parquet preference pairs: prompt, chosen, rejected (text or messages; or chosen and "
                       "rejected conversations sharing their prompt)", "DPOConfig")


def dpo(args: argparse.Namespace) -> int:
    from groundup.posttrain.align import dpo as run
    from groundup.posttrain.config import DPOConfig
    from groundup.train.commands import print_summary

    cfg = _stage_config(DPOConfig, "dpo", args)
    return print_summary(run(cfg, args.resume or args.out, resume=args.resume is not None), "dpo")


def kto_arguments(p: argparse.ArgumentParser) -> None:
    _data_arguments(p, "JSONL/Parquet feedback: prompt, completion, label (true = desirable)", "KTOConfig")


def kto(args: argparse.Namespace) -> int:
    from groundup.posttrain.align import kto as run
    from groundup.posttrain.config import KTOConfig
    from groundup.train.commands import print_summary

    cfg = _stage_config(KTOConfig, "kto", args)
    return print_summary(run(cfg, args.resume or args.out, resume=args.resume is not None), "kto")


def grpo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", default=None, help="the policy to start from (usually an SFT run or model)")
    p.add_argument("--prompts", nargs="+", type=Path, default=None, help="JSONL/Parquet prompts: prompt (text or "
                   "messages) or messages (a final assistant message is dropped), plus fields rewards read (answer)")
    p.add_argument("--eval-prompts", nargs="+", type=Path, default=None, help="held-out prompts")
    p.add_argument("--reward", action="append", default=None, metavar="NAME[=WEIGHT]",
                   help="a shipped reward (exact_match, exact_match_lenient, format_answer, code) or module:function, "
                        "optionally =weight; repeat to combine")
    _run_arguments(p, "GRPOConfig")


def grpo(args: argparse.Namespace) -> int:
    from groundup.posttrain.config import GRPOConfig
    from groundup.posttrain.grpo import grpo as run
    from groundup.train.commands import print_summary

    args.data, args.eval_data = args.prompts, args.eval_prompts
    args.overrides = _reward_overrides("grpo", args.reward) + list(args.overrides)
    cfg = _stage_config(GRPOConfig, "grpo", args, data_key="prompts", eval_key="eval_prompts")
    return print_summary(run(cfg, args.resume or args.out, resume=args.resume is not None), "grpo")


def rm_arguments(p: argparse.ArgumentParser) -> None:
    _data_arguments(p, "JSONL/Parquet preference pairs: prompt, chosen, rejected (text or messages)", "RMConfig")


def rm(args: argparse.Namespace) -> int:
    from groundup.posttrain.config import RMConfig
    from groundup.posttrain.reward_model import rm as run
    from groundup.train.commands import print_summary

    cfg = _stage_config(RMConfig, "rm", args)
    return print_summary(run(cfg, args.resume or args.out, resume=args.resume is not None), "rm")


def _reward_overrides(section: str, rewards: list[str] | None) -> list[str]:
    import json

    from groundup.rewards.functions import parse_reward_args

    if not rewards:
        return []
    names, weights = parse_reward_args(rewards)
    return [f"{section}.rewards={json.dumps(names)}", f"{section}.reward_weights={json.dumps(weights)}"]


def rft_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", default=None, help="the model to start from (usually an SFT run or model)")
    p.add_argument("--prompts", nargs="+", type=Path, default=None, help="JSONL/Parquet prompt records (as grpo's)")
    p.add_argument("--eval-prompts", nargs="+", type=Path, default=None, help="held-out prompts")
    p.add_argument("--reward", action="append", default=None, metavar="NAME[=WEIGHT]", help="as grpo's --reward")
    p.add_argument("--out", required=True, type=Path, help="directory of the rounds (a rerun continues it)")
    p.add_argument("--config", type=Path, default=None, help="TOML file of RFTConfig sections")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. rft.rounds=2 rft.samples=8")


def rft(args: argparse.Namespace) -> int:
    from groundup.posttrain.config import RFTConfig
    from groundup.posttrain.rft import rft as run

    args.resume, args.data, args.eval_data = None, args.prompts, args.eval_prompts
    args.overrides = _reward_overrides("rft", args.reward) + list(args.overrides)
    cfg = _stage_config(RFTConfig, "rft", args, data_key="prompts", eval_key="eval_prompts")
    run(cfg, args.out)
    return 0


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
