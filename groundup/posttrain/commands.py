"""The post-training verbs: `sft`, `dpo`, `kto`, `reward-model`, `grpo`, `rft`, and `merge-lora`.

    groundup sft --model out/model --data chat/chat-math.jsonl --out runs/sft [lora.rank=16 ...]
    groundup dpo --model runs/sft --data pairs.jsonl --out runs/dpo dpo.beta=0.1
    groundup rm --process --model runs/sft --data chat/chat-math.jsonl --out runs/prm prm.completions=8
    groundup sft --resume runs/sft
    groundup merge-lora --adapter runs/sft --out out/model-sft

`--model` is also spelled `--base`, `rm` and `merge` are the old names of `reward-model` and `merge-lora`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from groundup.arguments import (add_config_arguments, add_model_argument, add_output_arguments,
                                add_progress_argument)

CONFIGS = "groundup.posttrain.config"


def _run_arguments(p: argparse.ArgumentParser, config: str, example: str = "lora.rank=16") -> None:
    add_output_arguments(p)
    add_progress_argument(p)
    add_config_arguments(p, f"{CONFIGS}:{config}", example)


def _data_arguments(p: argparse.ArgumentParser, what: str, config: str) -> None:
    add_model_argument(p, required=False, help="the model to train: a model or run directory (an SFT run), an "
                       "imported model (default on --resume: the run's own)")
    p.add_argument("--data", nargs="+", type=Path, default=None, help=what)
    p.add_argument("--eval-data", nargs="+", type=Path, default=None, help="held-out files (default: records whose "
                   "split is 'heldout', else val_fraction of the data)")
    _run_arguments(p, config)


def _prompt_arguments(p: argparse.ArgumentParser, reward_help: str) -> None:
    add_model_argument(p, required=False, help="the policy to start from (usually an SFT run or model)")
    p.add_argument("--prompts", nargs="+", type=Path, default=None, help="JSONL/Parquet prompts: prompt (text or "
                   "messages) or messages (a final assistant message is dropped), plus fields rewards read (answer)")
    p.add_argument("--eval-prompts", nargs="+", type=Path, default=None, help="held-out prompts")
    p.add_argument("--reward", action="append", default=None, metavar="NAME[=WEIGHT]", help=reward_help)


def _paths(key: str, paths) -> list[str]:
    return [f"{key}={json.dumps([str(x) for x in paths])}"] if paths else []


def _stage_config(cls, section: str, args: argparse.Namespace, data_key: str = "data", eval_key: str = "eval_data"):
    from groundup.config import inputs_and_overrides
    from groundup.train.commands import load_run_config

    # an nargs="+" list swallows the overrides that follow it (`--eval-data h.jsonl train.seq_len=128`)
    data, moved = inputs_and_overrides(args.data or [])
    held, moved_held = inputs_and_overrides(getattr(args, "eval_data", None) or [])
    args.overrides = moved + moved_held + list(args.overrides)
    extra = _paths(f"{section}.{data_key}", data) + _paths(f"{section}.{eval_key}", held)
    extra += [f"base={json.dumps(args.model)}"] if args.model else []
    return load_run_config(cls, args, extra)


def _train(verb: str, cls_name: str, run, args: argparse.Namespace, section: str | None = None, **keys) -> int:
    from groundup.posttrain import config
    from groundup.train.commands import print_summary

    cfg = _stage_config(getattr(config, cls_name), section or verb, args, **keys)  # sets args.run_dir, resuming
    return print_summary(run(cfg, args.run_dir, resume=args.resuming), verb)


def sft_arguments(p: argparse.ArgumentParser) -> None:
    _data_arguments(p, "JSONL/Parquet files: messages, prompt/completion, text, ShareGPT conversations or Alpaca "
                       "instruction/output records", "SFTConfig")


def sft(args: argparse.Namespace) -> int:
    from groundup.posttrain.sft import sft as run

    return _train("sft", "SFTConfig", run, args)


def dpo_arguments(p: argparse.ArgumentParser) -> None:
    _data_arguments(p, "JSONL/Parquet preference pairs: prompt, chosen, rejected (text or messages; or chosen and "
                       "rejected conversations sharing their prompt)", "DPOConfig")


def dpo(args: argparse.Namespace) -> int:
    from groundup.posttrain.align import dpo as run

    return _train("dpo", "DPOConfig", run, args)


def kto_arguments(p: argparse.ArgumentParser) -> None:
    _data_arguments(p, "JSONL/Parquet feedback: prompt, completion, label (true = desirable)", "KTOConfig")


def kto(args: argparse.Namespace) -> int:
    from groundup.posttrain.align import kto as run

    return _train("kto", "KTOConfig", run, args)


def reward_model_arguments(p: argparse.ArgumentParser) -> None:
    _data_arguments(p, "JSONL/Parquet preference pairs: prompt, chosen, rejected (text or messages); with --process: "
                       "prompts with an answer (their steps are labelled) or solutions labelled per step (prompt, "
                       "steps, labels)", "RMConfig")
    p.add_argument("--process", action="store_true", help="a process reward model: label each step of the policy's "
                   "solutions as Math-Shepherd does (prm.solutions, prm.completions, prm.estimation) and score every "
                   "step (prm.enabled=true); use it as prm:RUN")


def reward_model(args: argparse.Namespace) -> int:
    from groundup.posttrain.prm import process_rm
    from groundup.posttrain.reward_model import rm

    if args.process:
        args.overrides = ["prm.enabled=true"] + list(args.overrides)

    def run(cfg, out, resume=False):  # a resumed run is a process one when its saved config says so
        return (process_rm if cfg.prm.enabled else rm)(cfg, out, resume=resume)

    return _train("reward-model", "RMConfig", run, args, section="rm")


def grpo_arguments(p: argparse.ArgumentParser) -> None:
    _prompt_arguments(p, "a shipped reward (exact_match, exact_match_lenient, format_answer, code, tests_passed), "
                         "rm:PATH (a reward model), prm:PATH (a process reward model: the lowest step score) or "
                         "module:function, optionally =weight; repeat to combine")
    _run_arguments(p, "GRPOConfig", "grpo.beta=0.04")


def grpo(args: argparse.Namespace) -> int:
    from groundup.posttrain.grpo import grpo as run

    args.data, args.eval_data = args.prompts, args.eval_prompts
    args.overrides = _reward_overrides("grpo", args.reward) + list(args.overrides)
    return _train("grpo", "GRPOConfig", run, args, data_key="prompts", eval_key="eval_prompts")


def _reward_overrides(section: str, rewards: list[str] | None) -> list[str]:
    from groundup.rewards.functions import parse_reward_args

    if not rewards:
        return []
    names, weights = parse_reward_args(rewards)
    return [f"{section}.rewards={json.dumps(names)}", f"{section}.reward_weights={json.dumps(weights)}"]


def rft_arguments(p: argparse.ArgumentParser) -> None:
    _prompt_arguments(p, "as grpo's --reward")
    p.add_argument("--out", required=True, type=Path, help="directory of the rounds (a rerun with the same settings "
                   "continues it)")
    p.add_argument("--overwrite", action="store_true", help="discard the rounds in --out made with other settings "
                   "and start again")
    add_progress_argument(p)
    add_config_arguments(p, f"{CONFIGS}:RFTConfig", "rft.rounds=2 rft.samples=8")


def rft(args: argparse.Namespace) -> int:
    from groundup.posttrain.config import RFTConfig
    from groundup.posttrain.rft import rft as run

    args.resume, args.data, args.eval_data = None, args.prompts, args.eval_prompts  # rft reuses finished rounds
    args.overrides = _reward_overrides("rft", args.reward) + list(args.overrides)
    cfg = _stage_config(RFTConfig, "rft", args, data_key="prompts", eval_key="eval_prompts")
    run(cfg, args.out, overwrite=args.overwrite)
    return 0


def merge_lora_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adapter", required=True, type=Path, help="an adapter directory or a LoRA run")
    add_model_argument(p, required=False, help="the base model (default: the one the adapter names)")
    p.add_argument("--out", required=True, type=Path, help="the merged model directory to write")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")


def merge_lora(args: argparse.Namespace) -> int:
    from groundup.posttrain.merge import merge_adapter

    out = merge_adapter(args.adapter, args.out, base=args.model, dtype=args.dtype, overwrite=args.overwrite)
    print(f"wrote {out}: the base with the adapter folded in (generate, chat, eval and export read it)")
    return 0
