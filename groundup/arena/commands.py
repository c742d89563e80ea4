"""`groundup arena`: run battles between models and rate them, or rate a battle log someone already has.

    groundup arena --battles battles.jsonl --out arena/                        # rate a log (JSONL or Parquet)
    groundup arena --battles votes.jsonl --out arena/ --baseline gpt-4 --anchor mixtral-8x7b-instruct-v0.1
    groundup arena --models base=out/base sft=out/sft gpt=http://host/v1#gpt-4o-mini --prompts prompts.jsonl \\
        --judge http://localhost:8000/v1#judge --out arena/ battles_per_pair=20 sampler=active

Running battles is arena/battles.py (resumable: run the same command again to continue); rating is
arena/report.py. Trailing key=value arguments and --config set BattleConfig's keys (--print-config lists them);
a model cannot be named like one of those keys.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from groundup.arguments import add_config_arguments, add_progress_argument


def arena_arguments(p: argparse.ArgumentParser) -> None:
    from groundup.arena.ratings import RatingConfig

    d = RatingConfig()
    what = p.add_argument_group("what to rate (one of)")
    what.add_argument("--battles", nargs="+", type=Path, metavar="FILE", help="rate an existing battle log: JSONL or "
                      "Parquet rows with FastChat's model_a, model_b, winner (model_a, model_b, tie, tie (bothbad))")
    what.add_argument("--models", nargs="+", metavar="NAME=SOURCE", help="run battles between these models: a "
                      "groundup model or run directory, or an OpenAI-compatible endpoint http://HOST/v1#MODEL (its API "
                      "key from the environment variable of api_key_env)")
    p.add_argument("--prompts", type=Path, help="with --models: JSONL chat prompts (messages or prompt; question_id, "
                   "category)")
    p.add_argument("--judge", metavar="SOURCE", help="with --models: the judge, a model directory or an endpoint")
    p.add_argument("--out", type=Path, required=True, help="the arena folder: battles.jsonl (with --models), "
                   "ratings.json, report.md, plots; a rerun continues its battles and rewrites the ratings")
    r = p.add_argument_group("ratings (FastChat's Bradley-Terry)")
    r.add_argument("--baseline", metavar="MODEL", help="also report each model's win rate and AlpacaEval 2 "
                   "length-controlled win rate against this model")
    r.add_argument("--anchor", metavar="MODEL", default=d.anchor, help="hold this model at --anchor-rating "
                   "(FastChat: mixtral-8x7b-instruct-v0.1 at 1114; default: none, the mean rating is "
                   f"{d.initial:g})")
    r.add_argument("--anchor-rating", type=float, default=d.anchor_rating, help=f"(default: {d.anchor_rating:g})")
    r.add_argument("--bootstrap", type=int, default=d.bootstrap, help="bootstrap rounds of the 95%% intervals "
                   f"(default: {d.bootstrap}; 0 = none)")
    r.add_argument("--seed", type=int, default=d.seed, help=f"seed of the bootstrap (default: {d.seed})")
    r.add_argument("--each-order", action="store_true", help="rate the two judged orders of a battle as two "
                   "battles (default: one battle; the same winner both ways wins, anything else is a tie)")
    r.add_argument("--style-control", action="store_true", help="also rate with answer length and markdown as "
                   "covariates (FastChat's style control; needs answer_a and answer_b)")
    add_progress_argument(p)
    add_config_arguments(p, "groundup.arena.battles:BattleConfig", "battles_per_pair=20 sampler=active")


def split_models(items: list[str], keys: set[str]) -> tuple[dict[str, str], list[str]]:
    """NAME=SOURCE pairs, and the key=value overrides argparse put among them (a NAME that is a config key)."""
    from groundup.errors import ConfigError

    models: dict[str, str] = {}
    overrides: list[str] = []
    for item in items:
        name, eq, source = item.partition("=")
        if name.split(".")[0] in keys:
            overrides.append(item)
        elif not eq or not name.strip() or not source.strip():
            raise ConfigError(f"--models {item!r}: expected NAME=SOURCE", key="models")
        elif name in models:
            raise ConfigError(f"--models: {name!r} is named twice", key="models")
        else:
            models[name] = source
    return models, overrides


def arena(args: argparse.Namespace) -> int:
    import dataclasses
    import importlib.util

    from groundup.arena.battles import BattleConfig, run_battles
    from groundup.arena.ratings import RatingConfig
    from groundup.arena.report import RATINGS_FILE, REPORT_FILE, rate_log
    from groundup.config import inputs_and_overrides, load_config
    from groundup.errors import ConfigError
    from groundup.layout import claim_output_dir

    if importlib.util.find_spec("sklearn") is None:
        raise ConfigError("groundup arena fits its ratings with scikit-learn: pip install scikit-learn", key="arena")
    if (args.battles is None) == (args.models is None):
        raise ConfigError("give --battles FILE (rate a log) or --models NAME=SOURCE ... (run battles), not both",
                          key="battles")
    rating = RatingConfig(anchor=args.anchor or "", anchor_rating=args.anchor_rating, bootstrap=args.bootstrap,
                          seed=args.seed, style_control=args.style_control)
    rating.validate()
    if args.battles is not None:
        args.battles, moved = inputs_and_overrides(args.battles)
        if moved or args.overrides or args.config:
            raise ConfigError(f"{' '.join([*moved, *args.overrides]) or '--config'}: battle settings apply only "
                              "when --models runs battles", key="battles")
        for flag in ("prompts", "judge"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag} goes with --models (running battles), not --battles", key=flag)
        # No `sources`: nothing is replaced, so a log inside the folder (a --models run's) may be rated again there.
        claim_output_dir(args.out, "arena", mark=True)
        logs = args.battles
    else:
        keys = {f.name for f in dataclasses.fields(BattleConfig)}
        models, moved = split_models(args.models, keys)
        for flag in ("prompts", "judge"):
            if getattr(args, flag) is None:
                raise ConfigError(f"--models needs --{flag}", key=flag)
        cfg = load_config(BattleConfig, args.config, [*moved, *args.overrides])
        claim_output_dir(args.out, "arena", mark=True)
        logs = [run_battles(models, args.prompts, args.judge, args.out, cfg, progress=not args.quiet)]
    results = rate_log(logs, args.out, rating, baseline=args.baseline, each_order=args.each_order,
                       progress=not args.quiet)
    best = results["models"][0]
    shown = {k: "-" if best[k] is None else f"{best[k]:.1f}" for k in ("rating", "lower", "upper")}
    print(f"{args.out / RATINGS_FILE}, {args.out / REPORT_FILE}: {len(results['models'])} models from "
          f"{results['battles']:,} battles ({results['rows_skipped']:,} rows skipped); first {best['model']} "
          f"at {shown['rating']} ({shown['lower']} to {shown['upper']})")
    for example in results["skipped_examples"][:3]:
        print(f"  skipped {example}")
    return 0
