"""`groundup data sample`: write the embedded corpus as JSONL, one file per source."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from groundup.errors import ConfigError, DataError
from groundup.io import atomic_open, ensure_writable_dir


def sample_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="directory for <source>.jsonl files")
    p.add_argument("--domains", nargs="+", default=["text", "code", "math"], help="text, code, math")
    p.add_argument("--chunk-chars", type=int, default=None, help="split long documents at paragraph breaks")
    p.add_argument("--math-count", type=int, default=20_000, help="number of generated math problems")
    p.add_argument("--limit", type=int, default=None, help="at most this many records per source")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace <source>.jsonl files already in --out")


def sample(args: argparse.Namespace) -> None:
    from groundup.corpus import iter_corpus

    for flag, value, least in (("--math-count", args.math_count, 0), ("--limit", args.limit, 1),
                               ("--chunk-chars", args.chunk_chars, 1)):
        if value is not None and value < least:
            raise ConfigError(f"{flag} {value}: expected an integer >= {least}", key=flag)
    out = ensure_writable_dir(args.out)
    sources = {"text": "shakespeare", "code": "python-stdlib", "math": "math-synthetic"}
    existing = [out / f"{sources.get(d, d)}.jsonl" for d in args.domains if (out / f"{sources.get(d, d)}.jsonl").exists()]
    if existing and not args.overwrite:
        raise DataError(f"{existing[0]} already exists: choose another --out or pass --overwrite")
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    with contextlib.ExitStack() as stack:  # every file is renamed into place only if all succeed
        files = {}
        for record in iter_corpus(args.domains, chunk_chars=args.chunk_chars, math_count=args.math_count,
                                  seed=args.seed):
            source = record["source"]
            if args.limit is not None and counts.get(source, 0) >= args.limit:
                continue
            if source not in files:
                files[source] = stack.enter_context(atomic_open(out / f"{source}.jsonl", "w", encoding="utf-8"))
            files[source].write(json.dumps(record, ensure_ascii=False) + "\n")
            counts[source] = counts.get(source, 0) + 1
            sizes[source] = sizes.get(source, 0) + len(record["text"].encode("utf-8"))
    for source in counts:
        print(f"{out / (source + '.jsonl')}: {counts[source]:,} records, {sizes[source] / 1e6:.1f} MB of text")
