"""`groundup data annotate`: its flags (defaults read from AnnotateConfig, so they cannot drift) and its summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from groundup.arguments import add_progress_argument, resolve_output
from groundup.data.annotate import (ANNOTATIONS_FILE, CLASSIFIER_FILE, RUBRIC_FILE, AnnotateConfig, check_resumable,
                                    annotate as run)
from groundup.data.annotate_report import REPORT_MD
from groundup.layout import claim_output_dir, mark_output_dir

VERB = "data annotate"


def annotate_arguments(p: argparse.ArgumentParser) -> None:
    d = AnnotateConfig()
    p.add_argument("--input", required=True, nargs="+", type=Path, metavar="PATH",
                   help="JSONL, Parquet, text files, curated shards or directories (as `data curate` reads them)")
    p.add_argument("--endpoint", required=True, metavar="URL",
                   help="an OpenAI-compatible API, e.g. http://localhost:8000/v1 (`groundup serve`, vLLM, a hosted one)")
    p.add_argument("--model", required=True, metavar="NAME", help="the model name the endpoint serves")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help=f"{ANNOTATIONS_FILE}, {CLASSIFIER_FILE}, report.json, {REPORT_MD}; a rerun with the same "
                        "settings continues it")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="DIR",
                   help="continue the annotations in DIR (--resume DIR, or --out DIR --resume); refused when it "
                        "holds none")
    g = p.add_argument_group("the judge")
    g.add_argument("--rubric", type=Path, default=None, metavar="FILE",
                   help="the prompt: {document} where the text goes, ending by asking for the line "
                        f"'{d.verdict}: <points>' (default: a FineWeb-Edu-style additive 0-5 scale; --out/{RUBRIC_FILE} "
                        "holds the prompt used, to copy and edit)")
    g.add_argument("--verdict", default=d.verdict, metavar="LABEL",
                   help=f"the label of the answer's last line, LABEL: N (default: {d.verdict!r})")
    g.add_argument("--api-key-env", default=d.api_key_env, metavar="NAME",
                   help=f"environment variable holding the API key (default: {d.api_key_env}; unset: no key). "
                        "The key is never a flag and is written nowhere")
    g.add_argument("--max-chars", type=int, default=d.max_chars, metavar="N",
                   help=f"the head of each document sent; 0 = all (default: {d.max_chars:,})")
    g.add_argument("--temperature", type=float, default=d.temperature, help=f"(default: {d.temperature})")
    g.add_argument("--max-tokens", type=int, default=d.max_tokens, metavar="N",
                   help=f"the longest answer (default: {d.max_tokens})")
    g = p.add_argument_group("the sample")
    g.add_argument("--sample", type=int, default=d.sample, metavar="N",
                   help=f"documents to annotate; may grow on a rerun (default: {d.sample:,})")
    g.add_argument("--seed", type=int, default=d.seed, help=f"picks the sample and the held-out set (default: {d.seed})")
    g = p.add_argument_group("requests")
    g.add_argument("--concurrency", type=int, default=d.concurrency, metavar="C",
                   help=f"requests in flight (default: {d.concurrency})")
    g.add_argument("--rate", type=float, default=d.rate, metavar="R", help="requests per second; 0 = no limit (default)")
    g.add_argument("--max-retries", type=int, default=d.max_retries, metavar="K",
                   help=f"retries of a timeout, 408/409/429/5xx or malformed answer (default: {d.max_retries})")
    g.add_argument("--timeout", type=float, default=d.timeout, metavar="S",
                   help=f"seconds to wait for one answer (default: {d.timeout:g})")
    g.add_argument("--backoff", type=float, default=d.backoff, metavar="S",
                   help=f"seconds before the first retry, doubling after (default: {d.backoff:g})")
    g.add_argument("--max-consecutive-failures", type=int, default=d.max_consecutive_failures, metavar="N",
                   help=f"stop when N documents in a row fail; 0 = never (default: {d.max_consecutive_failures})")
    g = p.add_argument_group("the classifier")
    g.add_argument("--threshold", type=int, default=d.threshold,
                   help=f"a score at or above this is good (default: {d.threshold}, FineWeb-Edu's)")
    g.add_argument("--held-out", type=float, default=d.held_out, metavar="F",
                   help=f"fraction of annotations kept to measure the classifier (default: {d.held_out})")
    g.add_argument("--epochs", type=int, default=d.epochs, help=f"(default: {d.epochs})")
    g.add_argument("--bits", type=int, default=d.bits, help=f"2^bits hashed feature buckets (default: {d.bits})")
    add_progress_argument(p)


def config_from(args: argparse.Namespace) -> AnnotateConfig:
    return AnnotateConfig(
        endpoint=args.endpoint, model=args.model, rubric=str(args.rubric) if args.rubric else None,
        verdict=args.verdict, api_key_env=args.api_key_env, sample=args.sample, seed=args.seed,
        max_chars=args.max_chars, temperature=args.temperature, max_tokens=args.max_tokens,
        concurrency=args.concurrency, rate=args.rate, max_retries=args.max_retries, timeout=args.timeout,
        backoff=args.backoff, max_consecutive_failures=args.max_consecutive_failures, threshold=args.threshold,
        held_out=args.held_out, epochs=args.epochs, bits=args.bits)


def annotate(args: argparse.Namespace) -> None:
    cfg = config_from(args)
    cfg.validate()
    args.out, resume = resolve_output(args)
    claim_output_dir(args.out, VERB, resume=resume, sources=args.input)
    if resume:
        check_resumable(args.out)
    mark_output_dir(args.out, VERB)
    report = run(args.input, args.out, cfg, resume=resume, progress=not args.quiet)
    r, f, clf = report["this_run"], report["folder"], report["classifier"]
    print(f"{report['sample']['documents']:,} documents sampled, {r['already_annotated']:,} annotated before; "
          f"sent {r['sent']:,}: {r['scored']:,} scored, {r['unparsable']:,} unparsable, {r['failed']:,} failed after "
          f"retries ({r['requests']:,} requests, {r['timeouts']:,} timeouts) in {r['elapsed_s']:.1f} s")
    if f["pending"]:
        print(f"  pending (not annotated yet): {f['pending']:,}; run the same command again to annotate them")
    if f["torn_lines_skipped"] or f["bad_lines"]:
        print(f"  {ANNOTATIONS_FILE}: {f['torn_lines_skipped']} torn last line dropped, {f['bad_lines']} bad lines "
              "skipped")
    print("  scores: " + ", ".join(f"{k}: {v:,}" for k, v in f["score_histogram"].items()))
    if not clf["trained"]:
        print(f"  warning: {clf['reason']}")
    else:
        held = clf["held_out"]
        if held["docs"]:
            print(f"  classifier vs {held['docs']:,} held-out annotations: accuracy {held['accuracy']:.3f}, "
                  f"AUC {_num(held['auc'])}, Spearman {_num(held['spearman'])}")
        print(f"{args.out / CLASSIFIER_FILE}: use with `data curate` classifier.model={args.out / CLASSIFIER_FILE}")
    print(f"{args.out / REPORT_MD}")


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
