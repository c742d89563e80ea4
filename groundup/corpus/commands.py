"""`groundup data sample`: write the embedded corpus as JSONL, one file per source.

    groundup data sample --out raw/                       # shakespeare.jsonl, python-stdlib.jsonl, math-synthetic.jsonl
    groundup data sample --chat --out chat/ --domains math code text
        # chat-math.jsonl + chat-math.heldout.jsonl, ... in TRL's conversational format (`messages`)
    groundup data sample --chat --tools --out tools/ --domains math code [--math-max-operand 12]
        # chat-tools-math.jsonl, chat-tools-code.jsonl (+ .heldout): OpenAI's `tools` and `tool_calls`, the
        # results true (code runs in the sandbox); the code held-out file is the pass@1 set (corpus/tool_chats.py)
    groundup data sample --crawl --out crawl/ [--pages 2000] [--hostile]
        # crawl-00000.warc.gz, ...: web pages around the embedded corpus (navigation, ads, cookie banners,
        # comments, several charsets and languages), as Common Crawl writes WARCs (needs groundup[web]);
        # --hostile adds damaged files (truncated members, lying lengths, binary payloads, a 10 MB page)
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from groundup.errors import ConfigError, DataError
from groundup.io import atomic_open
from groundup.layout import claim_output_dir


def sample_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="directory for <source>.jsonl files")
    p.add_argument("--domains", nargs="+", default=["text", "code", "math"], help="text, code, math")
    p.add_argument("--chunk-chars", type=int, default=None, help="split long documents at paragraph breaks")
    p.add_argument("--math-count", type=int, default=20_000, help="number of generated math problems")
    p.add_argument("--math-max-operand", type=int, default=0,
                   help="bound every number a math problem draws (0: full ranges, up to 999)")
    p.add_argument("--limit", type=int, default=None, help="at most this many records per source")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace <source>.jsonl files already in --out")
    p.add_argument("--crawl", action="store_true",
                   help="web pages as WARC files (crawl-NNNNN.warc.gz) for `data extract` and `data curate`")
    p.add_argument("--pages", type=int, default=2000, help="with --crawl: how many pages")
    p.add_argument("--pages-per-file", type=int, default=500, help="with --crawl: pages in each WARC file")
    p.add_argument("--hostile", action="store_true",
                   help="with --crawl: also write damaged crawl files (hostile-<kind>.warc.gz), each counted, never fatal")
    p.add_argument("--chat", action="store_true", help="conversations for fine-tuning instead (math, code, text), "
                   "each source split into <source>.jsonl and <source>.heldout.jsonl")
    p.add_argument("--tools", action="store_true", help="with --chat: tool-use conversations (OpenAI's tools and "
                   "tool_calls): math through the calculator or python, code tasks written and tested through python "
                   "with real results (of --domains, math and code; --limit code tasks, default 2000)")


def sample(args: argparse.Namespace) -> None:
    from groundup.corpus import iter_corpus

    for flag, value, least in (("--math-count", args.math_count, 0), ("--limit", args.limit, 1),
                               ("--chunk-chars", args.chunk_chars, 1),
                               ("--math-max-operand", args.math_max_operand, 0)):
        if value is not None and value < least:
            raise ConfigError(f"{flag} {value}: expected an integer >= {least}", key=flag)
    if args.tools and not args.chat:
        raise ConfigError("--tools goes with --chat (tool-use conversations)", key="--tools")
    out = claim_output_dir(args.out, "data sample", mark=True)
    if args.crawl:
        return _sample_crawl(args, out)
    if args.chat and args.tools:
        from groundup.corpus.tool_chats import iter_tool_chats

        sources = {"code": "chat-tools-code", "math": "chat-tools-math"}
        records = iter_tool_chats(args.domains, math_count=args.math_count, seed=args.seed,
                                  max_operand=args.math_max_operand,
                                  **({"code_count": args.limit} if args.limit else {}))
    elif args.chat:
        from groundup.corpus.chat import iter_chat

        sources = {"text": "chat-text", "code": "chat-code", "math": "chat-math"}
        records = iter_chat(args.domains, math_count=args.math_count, seed=args.seed, max_operand=args.math_max_operand,
                            **({"code_count": args.limit, "text_count": args.limit} if args.limit else {}))
    else:
        sources = {"text": "shakespeare", "code": "python-stdlib", "math": "math-synthetic"}
        records = iter_corpus(args.domains, chunk_chars=args.chunk_chars, math_count=args.math_count, seed=args.seed,
                              max_operand=args.math_max_operand)
    existing = [out / f"{sources.get(d, d)}.jsonl" for d in args.domains if (out / f"{sources.get(d, d)}.jsonl").exists()]
    if existing and not args.overwrite:
        raise DataError(f"{existing[0]} already exists: choose another --out or pass --overwrite")
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    with contextlib.ExitStack() as stack:  # every file is renamed into place only if all succeed
        files = {}
        for record in records:
            source = record["source"] + (".heldout" if record.get("split") == "heldout" else "")
            if args.limit is not None and counts.get(source, 0) >= args.limit:
                continue
            if source not in files:
                files[source] = stack.enter_context(atomic_open(out / f"{source}.jsonl", "w", encoding="utf-8"))
            files[source].write(json.dumps(record, ensure_ascii=False) + "\n")
            counts[source] = counts.get(source, 0) + 1
            text = record["text"] if "text" in record else "".join(
                (m["content"] or "") + "".join(c["function"]["arguments"] for c in m.get("tool_calls") or [])
                for m in record["messages"])  # a tool call's text is its arguments
            sizes[source] = sizes.get(source, 0) + len(text.encode("utf-8"))
    for source in counts:
        print(f"{out / (source + '.jsonl')}: {counts[source]:,} records, {sizes[source] / 1e6:.1f} MB of text")


def _sample_crawl(args: argparse.Namespace, out: Path) -> None:
    from groundup.corpus.crawl import HOSTILE_KINDS, CrawlResponse, write_hostile, write_warc
    from groundup.corpus.web_pages import make_pages

    for flag, value in (("--pages", args.pages), ("--pages-per-file", args.pages_per_file)):
        if value < 1:
            raise ConfigError(f"{flag} {value}: expected an integer >= 1", key=flag)
    pages = make_pages(args.pages, seed=args.seed)
    names = [f"crawl-{i:05d}.warc.gz" for i in range(0, (len(pages) + args.pages_per_file - 1) // args.pages_per_file)]
    hostile = {kind: f"hostile-{kind}.warc" + ("" if kind.endswith("_plain") else ".gz") for kind in HOSTILE_KINDS}
    names += list(hostile.values()) if args.hostile else []
    existing = [out / n for n in names if (out / n).exists()]
    if existing and not args.overwrite:
        raise DataError(f"{existing[0]} already exists: choose another --out or pass --overwrite")
    size = 0
    for i in range(0, len(pages), args.pages_per_file):
        chunk = pages[i:i + args.pages_per_file]
        write_warc(out / f"crawl-{i // args.pages_per_file:05d}.warc.gz",
                   [CrawlResponse(p.url, p.html.encode(p.charset), f"text/html; charset={p.charset}") for p in chunk])
        size += sum(len(p.html) for p in chunk)
    print(f"{out}: {len(pages):,} pages ({size / 1e6:.1f} MB of HTML) in "
          f"{(len(pages) + args.pages_per_file - 1) // args.pages_per_file} WARC files")
    if args.hostile:
        for kind in HOSTILE_KINDS:
            write_hostile(out / hostile[kind], kind)
        print(f"  and {len(HOSTILE_KINDS)} damaged files: {', '.join(HOSTILE_KINDS)}")
