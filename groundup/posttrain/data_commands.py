"""`groundup data pairs`: preference pairs from a model's own samples, ranked by verifiable rewards.

    groundup data pairs --model runs/sft --prompts chat/chat-math.jsonl --reward exact_match --out pairs.jsonl
    groundup data pairs ... --resume          # after a crash or Ctrl-C: continue from the last finished chunk
    groundup data pairs ... --resume pairs.jsonl                     # the same, naming the file

The work is saved a chunk of prompts at a time (posttrain/sampling_job.py), so a stopped run loses at
most one chunk and a resumed one writes the same file as an uninterrupted run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from groundup.arguments import (add_loading_arguments, add_model_argument, add_output_arguments, add_progress_argument,
                                resolve_output)


def pairs_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p, help="the model to sample from (a model, run or adapter directory)")
    p.add_argument("--prompts", required=True, nargs="+", type=Path, help="JSONL/Parquet prompt records (prompt or "
                   "messages, plus the fields the rewards read, e.g. answer)")
    p.add_argument("--reward", action="append", required=True, metavar="NAME[=WEIGHT]",
                   help="exact_match, exact_match_lenient, format_answer, code, rm:PATH or module:function")
    add_output_arguments(p, "pairs file (JSONL, TRL's format)")
    p.add_argument("--samples", type=int, default=8, help="completions sampled per prompt (8)")
    p.add_argument("--pairs-per-prompt", type=int, default=1, help="up to this many pairs a prompt: the i-th best "
                   "distinct sample against the i-th worst, while the best scores higher (1)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=None, help="at most this many prompts (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace --out (when the new one is complete) and "
                   "discard an unfinished run's work")
    p.add_argument("--chunk", type=int, default=256, help="prompts sampled between saves of the work done (256; "
                   "rounded up to whole sampling batches)")
    add_loading_arguments(p, adapter=False, dtype=False)
    p.add_argument("--batch-size", type=int, default=32, help="completions sampled together (32; larger on a GPU)")
    p.add_argument("--reward-patience", type=int, default=20, metavar="N", help="stop with an error when a reward "
                   "failed on every call of N sampling batches in a row, or every prompt's samples scored alike in "
                   "the first N batches (20; 0 = never stop)")
    add_progress_argument(p)


def pairs(args: argparse.Namespace) -> int:
    from groundup.errors import ConfigError, DataError
    from groundup.infer import Generator
    from groundup.loading import load_for_inference
    from groundup.rewards.functions import load_rewards, parse_reward_args
    from groundup.rewards.health import RewardHealth
    from groundup.posttrain.rollout import read_prompts
    from groundup.posttrain.sampled_data import make_pairs, nothing_written
    from groundup.posttrain.sampling_job import SamplingJob

    if args.samples < 2:
        raise ConfigError(f"--samples {args.samples}: expected at least 2 (a pair needs two samples)", key="samples")
    for flag, value in (("--pairs-per-prompt", args.pairs_per_prompt), ("--batch-size", args.batch_size),
                        ("--chunk", args.chunk)):
        if value < 1:
            raise ConfigError(f"{flag} {value}: expected at least 1", key=flag.strip("-").replace("-", "_"))
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit {args.limit}: expected at least 1 (leave it out for every prompt)", key="limit")
    if args.reward_patience < 0:
        raise ConfigError(f"--reward-patience {args.reward_patience}: expected an integer >= 0 (0 = never stop)",
                          key="reward_patience")
    args.out, args.resume = resolve_output(args)
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite: choose one (continue the unfinished run, or start again)",
                          key="resume")
    rewards = load_rewards(*parse_reward_args(args.reward))
    job = SamplingJob(args.out, pairs_settings(args), resume=args.resume, overwrite=args.overwrite, what="pairs file")
    with job.locked():
        model, tok = load_for_inference(args.model, device=args.device, tokenizer=args.tokenizer, merge=True)
        if args.max_new_tokens >= model.cfg.max_seq_len:
            raise ConfigError(f"--max-new-tokens {args.max_new_tokens}: at or over the model's context "
                              f"({model.cfg.max_seq_len} tokens); leave room for the prompt", key="max_new_tokens")
        prompts, held, bad = read_prompts(args.prompts, tok, model.cfg.max_seq_len - args.max_new_tokens)
        prompts = (prompts + held)[: args.limit]
        if not prompts:
            raise DataError(f"no usable prompt in {', '.join(map(str, args.prompts))} ({len(bad):,} records skipped: "
                            + "; ".join(bad[:3]) + ")")
        health = RewardHealth([r.name for r in rewards], args.reward_patience, "batches", "--reward-patience 0")
        if job.state["counts"].get("varied"):
            health.varied_before()
        done = job.state["prompts_done"]
        if done:
            print(f"{args.out}: resuming after {done:,} of {len(prompts):,} prompts "
                  f"({job.state['counts'].get('pairs', 0):,} pairs so far)")
        gen = Generator(model, tok)

        def build(part, seed):
            errors: list[str] = []
            records, counts = make_pairs(gen, part, rewards, args.samples, errors, per_prompt=args.pairs_per_prompt,
                                         health=health, batch_rows=args.batch_size, max_new_tokens=args.max_new_tokens,
                                         temperature=args.temperature, seed=seed)
            return records, counts, errors

        def nothing(state):
            why = nothing_written(state["counts"], state["failure_examples"], "each prompt's samples scored alike")
            return f"no pair from {len(prompts):,} prompts: {why}: nothing to prefer"

        try:
            state = job.run(prompts, build, args.samples, args.chunk, args.batch_size, args.seed,
                            progress=not args.quiet, nothing=nothing)
        finally:
            job.print_failures()
    pairs_written, alike = state["counts"].get("pairs", 0), len(prompts) - state["counts"].get("paired", 0)
    print(f"{args.out}: {pairs_written:,} pairs from {len(prompts):,} prompts ({alike:,} had samples all scored alike; "
          f"{len(bad):,} prompt records skipped, {state['reward_failures']:,} reward failures)")
    return 0


def pairs_settings(args: argparse.Namespace) -> dict:
    """What a resumed run must share with the run it continues (the device and chunk size may change)."""
    from groundup.rewards.functions import parse_reward_args
    from groundup.posttrain.sampling_job import input_settings

    return {**input_settings(args.model, args.prompts, *parse_reward_args(args.reward)), "samples": args.samples,
            "pairs_per_prompt": args.pairs_per_prompt, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "limit": args.limit,
            "seed": args.seed, "batch_size": args.batch_size}
