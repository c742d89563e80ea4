"""`groundup data extract`: a crawl's HTML pages as text records, without filtering (needs groundup[web])."""

from __future__ import annotations

import argparse
from pathlib import Path

from groundup.layout import claim_output_dir, claim_output_file


def extract_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", type=Path, metavar="INPUT",
                   help=".warc(.gz), .arc(.gz), .wet(.gz) files or folders of them; then key=value overrides of "
                        "the extraction settings, e.g. backend=trafilatura min_chars=0")
    p.add_argument("--out", required=True, type=Path,
                   help="FILE.jsonl (one file) or a folder (one .jsonl per crawl file, a rerun continues)")
    p.add_argument("--backend", choices=("trafilatura", "resiliparse"), default=None,
                   help="HTML-to-text extractor (backend=; default trafilatura: see the README's extraction table)")
    p.add_argument("--config", type=Path, default=None, help="TOML file of ExtractConfig keys")
    p.add_argument("--workers", type=int, default=1, help="processes extracting crawl files in parallel (into a folder)")
    p.add_argument("--max-page-bytes", type=int, default=8 << 20,
                   help="a bigger HTTP payload is skipped and counted, never held whole")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def extract(args: argparse.Namespace) -> None:
    from groundup.config import inputs_and_overrides, load_config
    from groundup.errors import ConfigError
    from groundup.data.web.extract import ExtractConfig
    from groundup.data.web.extract_run import extract as run
    from groundup.data.web.warc import PROBLEMS

    inputs, overrides = inputs_and_overrides(args.inputs)
    overrides += [f"backend={args.backend}"] if args.backend else []
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: expected an integer >= 1", key="--workers")
    cfg = load_config(ExtractConfig, args.config, overrides)
    if args.out.suffix == ".jsonl":
        claim_output_file(args.out, "data extract", "records file (.jsonl)")
    else:
        claim_output_dir(args.out, "data extract")
    s = run(inputs, args.out, cfg, workers=args.workers, max_page_bytes=args.max_page_bytes, progress=not args.quiet)
    print(f"{s['pages']:,} HTML pages from {s['files']:,} crawl files ({s['html_bytes'] / 1e6:.1f} MB): "
          f"{s['records']:,} records ({s['text_bytes'] / 1e6:.1f} MB of text), {s['no_main_content']:,} without "
          f"main content; {s['pages_per_s']} pages/s, {s['mb_per_s']} MB/s with backend {cfg.backend}")
    top = sorted(s["languages"].items(), key=lambda kv: -kv[1])[:8]
    if top:
        print("  languages: " + ", ".join(f"{lang} {n:,}" for lang, n in top))
    read = s["read"]
    problems = {k: read[k] for k in PROBLEMS if read.get(k)}
    if problems:
        print("  read problems (skipped and counted): " + ", ".join(f"{v:,} {k.replace('_', ' ')}"
                                                                    for k, v in problems.items()))
        for example in read.get("examples", [])[:5]:
            print(f"    {example}")
    if s["files_reused"]:
        print(f"  {s['files_reused']} crawl files were already extracted into {args.out} and were kept")
    if s["not_crawl_file_count"]:
        print(f"  {s['not_crawl_file_count']} other files were not read (not crawl files), e.g. {s['not_crawl_files'][0]}")
