"""`groundup data pairs`: preference pairs from a model's own samples, ranked by verifiable rewards.

    groundup data pairs --model runs/sft --prompts chat/chat-math.jsonl --reward exact_match --out pairs.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path


def pairs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="the model to sample from (a model, run or adapter directory)")
    p.add_argument("--prompts", required=True, nargs="+", type=Path, help="JSONL/Parquet prompt records (prompt or "
                   "messages, plus the fields the rewards read, e.g. answer)")
    p.add_argument("--reward", action="append", required=True, metavar="NAME[=WEIGHT]",
                   help="exact_match, exact_match_lenient, format_answer, code, rm:PATH or module:function")
    p.add_argument("--out", required=True, type=Path, help="the pairs file to write (JSONL, TRL's format)")
    p.add_argument("--samples", type=int, default=8, help="completions sampled per prompt (8)")
    p.add_argument("--pairs-per-prompt", type=int, default=1, help="up to this many pairs a prompt: the i-th best "
                   "distinct sample against the i-th worst, while the best scores higher (1)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: CUDA when present)")
    p.add_argument("--batch-size", type=int, default=32, help="completions sampled together (32; larger on a GPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def pairs(args: argparse.Namespace) -> int:
    from groundup.errors import ConfigError, DataError
    from groundup.infer import Generator
    from groundup.infer.loading import load_for_inference
    from groundup.posttrain.rewards import load_rewards, parse_reward_args
    from groundup.posttrain.rollout import read_prompts
    from groundup.posttrain.sampled_data import make_pairs, write_jsonl

    if args.samples < 2:
        raise ConfigError(f"--samples {args.samples}: expected at least 2 (a pair needs two samples)", key="samples")
    if args.out.exists() and not args.overwrite:
        raise DataError(f"{args.out} already exists: choose another --out or pass --overwrite")
    rewards = load_rewards(*parse_reward_args(args.reward))
    if args.pairs_per_prompt < 1:
        raise ConfigError(f"--pairs-per-prompt {args.pairs_per_prompt}: expected at least 1", key="pairs_per_prompt")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size {args.batch_size}: expected at least 1", key="batch_size")
    model, tok = load_for_inference(args.model, device=args.device, merge=True)
    prompts, held, bad = read_prompts(args.prompts, tok, model.cfg.max_seq_len - args.max_new_tokens)
    prompts = (prompts + held)[: args.limit]
    errors: list[str] = []
    records, paired = make_pairs(Generator(model, tok), prompts, rewards, args.samples, errors,
                         per_prompt=args.pairs_per_prompt, batch_rows=args.batch_size, progress=not args.no_progress,
                         max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    write_jsonl(records, args.out)
    print(f"{args.out}: {len(records):,} pairs from {len(prompts):,} prompts ({len(prompts) - paired:,} had "
          f"samples all scored alike; {len(bad):,} prompt records skipped, {len(errors):,} reward failures)")
    return 0
