"""`groundup data pairs`: preference pairs from a model's own samples, ranked by verifiable rewards; and
`groundup data trajectories`: agent logs made into SFT records (posttrain/trajectories.py).

    groundup data pairs --model runs/sft --prompts chat/chat-math.jsonl --reward exact_match --out pairs.jsonl
    groundup data pairs ... --resume          # after a crash or Ctrl-C: continue from the last finished chunk
    groundup data pairs ... --resume pairs.jsonl                     # the same, naming the file
    groundup data pairs --model runs/sft --prompts chat.jsonl --judge http://localhost:8000/v1#judge \
        --constitution principles.txt --judge-mode listwise --out pairs.jsonl   # ranked by an AI judge

    groundup data trajectories logs/ sessions.jsonl --tokenizer tok/ --max-tokens 2048 --out agent-sft.jsonl
        # agent logs (OpenAI messages, tools) checked (every call answered), long sessions split to fit; for sft

The samples are ranked by verifiable rewards (--reward) or by an AI judge against a constitution (--judge:
a groundup checkpoint, or an OpenAI-compatible endpoint with its key in the environment; posttrain/
judged_pairs.py). The work is saved a chunk of prompts at a time (posttrain/sampling_job.py), so a stopped
run loses at most one chunk and a resumed one writes the same file as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from groundup.arguments import (add_loading_arguments, add_model_argument, add_output_arguments, add_progress_argument,
                                resolve_output)


def pairs_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p, help="the model to sample from (a model, run or adapter directory)")
    p.add_argument("--prompts", required=True, nargs="+", type=Path, help="JSONL/Parquet prompt records (prompt or "
                   "messages, plus the fields the rewards read, e.g. answer)")
    p.add_argument("--reward", action="append", default=None, metavar="NAME[=WEIGHT]",
                   help="exact_match, exact_match_lenient, format_answer, code, tests_passed, rm:PATH or "
                        "module:function (or --judge)")
    _judge_arguments(p)
    add_output_arguments(p, "pairs file (JSONL, TRL's format)")
    p.add_argument("--format", choices=("pairs", "kto"), default="pairs", help="pairs: prompt/chosen/rejected, for "
                   "dpo and rm (the default); kto: each pair as two prompt/completion/label records, for kto")
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


def _judge_arguments(p: argparse.ArgumentParser) -> None:
    from groundup.judge.ranking import MODES, RankingConfig
    from groundup.judge.sources import DEFAULT_API_KEY_ENV

    d = RankingConfig()
    g = p.add_argument_group("an AI judge instead of rewards")
    g.add_argument("--judge", metavar="SOURCE", help="rank the samples by this judge: a groundup model directory or "
                   "an OpenAI-compatible endpoint http(s)://URL[#model] (its API key from the environment)")
    g.add_argument("--constitution", metavar="FILE", help="the principles the judge ranks by (a text file; default: "
                   "a short built-in constitution)")
    g.add_argument("--judge-mode", choices=MODES, default=None, help="pairwise: every two samples in both orders, "
                   f"ranked by wins; listwise: one ranking of all ({d.mode})")
    g.add_argument("--judge-retries", type=int, default=None, help="re-asks of a malformed verdict before the "
                   f"prompt is skipped and counted ({d.max_retries}; 0 = ask once)")
    g.add_argument("--judge-max-tokens", type=int, default=None, help=f"the judge's reply limit ({d.max_tokens})")
    g.add_argument("--judge-temperature", type=float, default=None, help=f"0 = greedy ({d.temperature:g})")
    g.add_argument("--judge-rate", type=float, default=None, help="an endpoint's requests a second at most (0 = no "
                   "limit, the default)")
    g.add_argument("--judge-timeout", type=float, default=None, help="an endpoint request's timeout, seconds (120)")
    g.add_argument("--judge-key-env", default=None, metavar="VAR", help="the environment variable holding the "
                   f"endpoint's API key ({DEFAULT_API_KEY_ENV})")


JUDGE_ONLY = ("constitution", "judge_mode", "judge_retries", "judge_max_tokens", "judge_temperature", "judge_rate",
              "judge_timeout", "judge_key_env")


def _check_scorer(args: argparse.Namespace) -> None:
    """One of --reward and --judge, and the --judge-* flags only with --judge: a one-line error naming them."""
    from groundup.errors import ConfigError

    if args.reward and args.judge:
        raise ConfigError("--reward and --judge: choose one (rank the samples by verifiable rewards or by an AI "
                          "judge)", key="judge")
    if not args.reward and not args.judge:
        raise ConfigError("--reward or --judge: give one (rank the samples by verifiable rewards or by an AI judge)",
                          key="reward")
    given = [k for k in JUDGE_ONLY if getattr(args, k) is not None]
    if given and not args.judge:
        flag = "--" + given[0].replace("_", "-")
        raise ConfigError(f"{flag} needs --judge (it sets how the judge ranks the samples)", key=given[0])


def ranking_config(args: argparse.Namespace):
    from groundup.judge.ranking import RankingConfig

    d = RankingConfig()
    cfg = RankingConfig(mode=args.judge_mode or d.mode,
                        max_retries=d.max_retries if args.judge_retries is None else args.judge_retries,
                        max_tokens=d.max_tokens if args.judge_max_tokens is None else args.judge_max_tokens,
                        temperature=d.temperature if args.judge_temperature is None else args.judge_temperature,
                        batch_rows=args.batch_size)
    cfg.validate()
    return cfg


def pairs(args: argparse.Namespace) -> int:
    from groundup.errors import ConfigError
    from groundup.infer import Generator
    from groundup.rewards.functions import load_rewards, parse_reward_args
    from groundup.rewards.health import RewardHealth
    from groundup.posttrain.pair_formats import as_format
    from groundup.posttrain.sampled_data import make_pairs, nothing_written
    from groundup.posttrain.sampling_job import SamplingJob

    _check_scorer(args)
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
    if args.judge:
        return judged(args)
    rewards = load_rewards(*parse_reward_args(args.reward))
    job = SamplingJob(args.out, pairs_settings(args), resume=args.resume, overwrite=args.overwrite, what="pairs file")
    with job.locked():
        model, tok, prompts, bad = _policy_and_prompts(args)
        health = RewardHealth([r.name for r in rewards], args.reward_patience, "batches", "--reward-patience 0")
        if job.state["counts"].get("varied"):
            health.varied_before()
        _resuming(args.out, job.state, len(prompts))
        gen = Generator(model, tok)

        def build(part, seed):
            errors: list[str] = []
            records, counts = make_pairs(gen, part, rewards, args.samples, errors, per_prompt=args.pairs_per_prompt,
                                         health=health, batch_rows=args.batch_size, max_new_tokens=args.max_new_tokens,
                                         temperature=args.temperature, seed=seed)
            return as_format(records, args.format), counts, errors

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
          f"{len(bad):,} prompt records skipped, {state['reward_failures']:,} reward failures)" + _kto_note(args, state))
    return 0


def _kto_note(args: argparse.Namespace, state: dict) -> str:
    return f"; written as {2 * state['counts'].get('pairs', 0):,} KTO records" if args.format == "kto" else ""


def _policy_and_prompts(args: argparse.Namespace):
    """(the model sampled from, its tokenizer, the prompts, the prompt records skipped)."""
    from groundup.errors import ConfigError, DataError
    from groundup.loading import load_for_inference
    from groundup.posttrain.rollout import read_prompts

    model, tok = load_for_inference(args.model, device=args.device, tokenizer=args.tokenizer, merge=True)
    if args.max_new_tokens >= model.cfg.max_seq_len:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens}: at or over the model's context "
                          f"({model.cfg.max_seq_len} tokens); leave room for the prompt", key="max_new_tokens")
    prompts, held, bad = read_prompts(args.prompts, tok, model.cfg.max_seq_len - args.max_new_tokens)
    prompts = (prompts + held)[: args.limit]
    if not prompts:
        raise DataError(f"no usable prompt in {', '.join(map(str, args.prompts))} ({len(bad):,} records skipped: "
                        + "; ".join(bad[:3]) + ")")
    return model, tok, prompts, bad


def _resuming(out, state: dict, prompts: int) -> None:
    if state["prompts_done"]:
        print(f"{out}: resuming after {state['prompts_done']:,} of {prompts:,} prompts "
              f"({state['counts'].get('pairs', 0):,} pairs so far)")


def judged(args: argparse.Namespace) -> int:
    """`data pairs --judge`: the samples ranked by an AI judge against a constitution (posttrain/judged_pairs.py)."""
    from groundup.errors import DataError
    from groundup.infer import Generator
    from groundup.judge.ranking import load_constitution
    from groundup.judge.sources import SourceError, open_source
    from groundup.posttrain.judged_pairs import judge_summary, judged_pairs
    from groundup.posttrain.pair_formats import as_format
    from groundup.posttrain.sampling_job import SamplingJob

    cfg, constitution = ranking_config(args), load_constitution(args.constitution)
    job = SamplingJob(args.out, judged_settings(args, cfg, constitution), resume=args.resume, overwrite=args.overwrite,
                      what="pairs file")
    with job.locked():
        model, tok, prompts, bad = _policy_and_prompts(args)
        options = {"api_key_env": args.judge_key_env, "timeout": args.judge_timeout, "rate": args.judge_rate}
        source = open_source(args.judge, device=args.device, **{k: v for k, v in options.items() if v is not None})
        _resuming(args.out, job.state, len(prompts))
        gen = Generator(model, tok)

        def build(part, seed):
            records, counts, errors = judged_pairs(gen, part, source, constitution, cfg, args.samples,
                                                   per_prompt=args.pairs_per_prompt, seed=seed,
                                                   batch_rows=args.batch_size, max_new_tokens=args.max_new_tokens,
                                                   temperature=args.temperature)
            return as_format(records, args.format), counts, errors

        def nothing(state):
            if state["counts"].get("judged", 0):
                return f"no pair from {len(prompts):,} prompts: the judge found each prompt's samples alike"
            example = state["failure_examples"][0] if state["failure_examples"] else "see above"
            return f"no pair from {len(prompts):,} prompts: the judge ranked none of them (e.g. {example})"

        try:
            state = job.run(prompts, build, args.samples, args.chunk, args.batch_size, args.seed,
                            progress=not args.quiet, nothing=nothing)
        except SourceError as e:
            kept = (f"the {job.state['prompts_done']:,} prompts done are kept: run it again with --resume"
                    if job.state["prompts_done"] else "nothing was kept")
            raise DataError(f"{args.out}: the judge failed: {e} ({kept})") from None
        finally:
            job.print_failures("not judged")
    print(f"{args.out}: {judge_summary(state['counts'], len(prompts))}; {len(bad):,} prompt records skipped"
          + _kto_note(args, state))
    return 0


def judged_settings(args: argparse.Namespace, cfg, constitution: str) -> dict:
    """What a resumed judged run must share with the run it continues: the inputs, the judge and how it is
    asked (the constitution by its hash), the sampling, and the chunk size (the judge's batches follow the
    chunks). The device and an endpoint's rate, timeout and key may change."""
    from groundup.posttrain.judged_pairs import judge_identity
    from groundup.posttrain.sampling_job import input_settings

    return {**input_settings(args.model, args.prompts, [], []), "judge": judge_identity(args.judge),
            "judge_mode": cfg.mode, "judge_retries": cfg.max_retries, "judge_max_tokens": cfg.max_tokens,
            "judge_temperature": cfg.temperature,
            "constitution_sha256": hashlib.sha256(constitution.encode("utf-8")).hexdigest(),
            "samples": args.samples, "pairs_per_prompt": args.pairs_per_prompt, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "limit": args.limit, "seed": args.seed, "batch_size": args.batch_size,
            "chunk": args.chunk, "format": args.format}


def pairs_settings(args: argparse.Namespace) -> dict:
    """What a resumed run must share with the run it continues (the device and chunk size may change)."""
    from groundup.rewards.functions import parse_reward_args
    from groundup.posttrain.sampling_job import input_settings

    return {**input_settings(args.model, args.prompts, *parse_reward_args(args.reward)), "samples": args.samples,
            "pairs_per_prompt": args.pairs_per_prompt, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "limit": args.limit,
            "seed": args.seed, "batch_size": args.batch_size,
            **({"format": args.format} if args.format != "pairs" else {})}  # absent: a record from before --format


def trajectories_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="agent logs in OpenAI's messages format: "
                   "JSONL (one conversation a line) or folders of .json files (one session each)")
    p.add_argument("--out", required=True, type=Path, help="the SFT records to write (JSONL, for `groundup sft`)")
    p.add_argument("--tokenizer", required=True, help="the tokenizer whose render_chat measures the sessions (the "
                   "model's to be trained)")
    p.add_argument("--max-tokens", type=int, default=0, metavar="N", help="split longer sessions at turn boundaries "
                   "into pieces of at most N tokens (0 = never split)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def trajectories(args: argparse.Namespace) -> int:
    import json

    from groundup.errors import ConfigError, DataError
    from groundup.io import atomic_open
    from groundup.layout import claim_output_file
    from groundup.posttrain.trajectories import Trajectories, iter_trajectories
    from groundup.tokenizer import load_tokenizer

    out = claim_output_file(args.out, "data trajectories", "records file (.jsonl)")
    if args.max_tokens < 0:
        raise ConfigError(f"--max-tokens {args.max_tokens}: expected an integer >= 0 (0 = never split)",
                          key="max_tokens")
    if any(out.resolve() == Path(p).resolve() for p in args.inputs):
        raise DataError(f"--out {out} is one of the inputs: name another file")
    if out.exists() and not args.overwrite:
        raise DataError(f"{out} already exists: choose another --out or pass --overwrite")
    tok, result = load_tokenizer(args.tokenizer), Trajectories()
    with atomic_open(out, "w", encoding="utf-8") as f:  # renamed into place only when every session is read
        for record in iter_trajectories(args.inputs, tok, args.max_tokens, result):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    for reason, examples in result.examples.items():
        for example in examples:
            print(f"  dropped ({reason}) {example}")
    for skipped in result.files_skipped_examples:
        print(f"  not read: {skipped}")
    print(f"{out}: {result.summary(args.max_tokens)}")
    return 0
