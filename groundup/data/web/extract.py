"""HTML to main-content text with a maintained extractor: trafilatura (what FineWeb used) or resiliparse
(what DCLM used), and the shingle-level precision/recall/F1 that article-extraction benchmarks report.

Promise: `Extractor(cfg)(html)` never raises for bad HTML. It returns the page's main content (navigation,
headers, footers, ads, cookie banners, comments and other boilerplate dropped; paragraph breaks, tables
and lists kept as lines of text) or None, and counts why in `Extractor.counts` (`too_big`, `timeout`,
`crashed`, `error`, `no_content`, `too_short`, next to `extracted`) with a one-line reason in
`last_skip`. A page over `max_html_bytes` is never parsed. With `timeout_s` > 0 the backend runs in one
persistent child process, killed and restarted when a page takes longer (resiliparse's main-content pass
is super-quadratic in nesting depth: 20,000 nested <div>s take 13 s, 100,000 over 4 minutes) or when it
dies; datatrove's extractors run the same way.

Each backend's text is what its reference pipeline keeps, byte for byte:
- trafilatura: `trafilatura.extract(html, favor_precision=True, include_comments=False, deduplicate=True)`
  as datatrove 0.10.1's `Trafilatura` step calls it for FineWeb. Paragraphs end in one newline. With
  `deduplicate`, a paragraph (or whole text) over 100 characters seen more than twice by this extractor
  is dropped; the count lives in this extractor (one cache per Extractor, as one per datatrove worker).
  lxml gives up on pages nested deeper than 256 elements: trafilatura then finds no main content.
- resiliparse: `extract_plain_text(HTMLTree.parse(html), main_content=True, alt_texts=False, ...)` with
  block formatting preserved, as DCLM's pool was extracted (paragraphs separated by blank lines), and
  `comments=False` so comment sections are dropped (resiliparse keeps them by default). Its main-content
  heuristics drop short `<ul>` lists inside articles as if they were menus (`<ol>` lists stay).

Default backend: trafilatura. On 300 `make_pages` pages (benchmarks/web_extract.py) it scores shingle F1
0.976 (P 0.971, R 0.980) at ~140 pages/s per core; resiliparse scores 0.962 (P 0.926: bylines, headlines
and related links kept; R 1.000) at ~1,500 pages/s. Both are acceptable speeds; trafilatura is better.

`shingle_scores` is scrapinghub's article-extraction-benchmark metric: `\\w+` tokens, 4-token shingles
counted as a multiset; `mean_scores` averages over pages as its `evaluate.py` does.
"""

from __future__ import annotations

import functools
import html as html_lib
import importlib
import multiprocessing
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Literal

from groundup.config import fail

BACKENDS = ("trafilatura", "resiliparse")
SKIP_REASONS = ("too_big", "timeout", "crashed", "error", "no_content", "too_short")
TITLE_RE = re.compile(r"<title\b[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)
TOKEN_RE = re.compile(r"\w+", re.UNICODE | re.MULTILINE | re.IGNORECASE | re.DOTALL)  # the benchmark's


@dataclass
class ExtractConfig:
    # "trafilatura" (FineWeb): better shingle F1 on our pages; "resiliparse" (DCLM): ~10x faster, lower F1.
    backend: Literal["trafilatura", "resiliparse"] = "trafilatura"
    # Extracted text shorter than this many characters counts as no main content; 0 = off.
    min_chars: int = 0
    # Pages larger than this (UTF-8 bytes) are skipped and counted, never parsed; 0 = no limit.
    max_html_bytes: int = 5 * 2**20
    # Seconds one page may take; the backend then runs in a child process killed on time-out. 0 = in-process.
    timeout_s: float = 5.0
    # trafilatura: prefer less text but correct (datatrove/FineWeb: True); False = trafilatura's balance.
    favor_precision: bool = True
    # trafilatura: keep table cells as text; False = drop tables.
    include_tables: bool = True
    # trafilatura: keep link targets in the text (markdown-style); False = text only.
    include_links: bool = False
    # trafilatura: drop paragraphs seen more than twice by this extractor (datatrove/FineWeb); False = off.
    deduplicate: bool = True
    # resiliparse: "•" or "1." before list items; False = items as bare lines.
    list_bullets: bool = True
    # resiliparse: keep images' alt text (DCLM: False); False = off.
    alt_texts: bool = False

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            fail("backend", self.backend, f"one of {list(BACKENDS)}")
        for key in ("min_chars", "max_html_bytes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                fail(key, value, "an integer >= 0 (0 = off)")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not self.timeout_s >= 0 or self.timeout_s == float("inf"):
            fail("timeout_s", self.timeout_s, "a finite number of seconds >= 0 (0 = in-process, no limit)")
        for key in ("favor_precision", "include_tables", "include_links", "deduplicate", "list_bullets",
                    "alt_texts"):
            if not isinstance(getattr(self, key), bool):
                fail(key, getattr(self, key), "true or false")


@dataclass(frozen=True)
class Extracted:
    text: str
    title: str | None


def trafilatura_text(html: str, cfg: ExtractConfig, dedup_cache: object = None) -> str | None:
    """datatrove's `Trafilatura().extract(html)`; `dedup_cache` (a trafilatura LRUCache) replaces the global one."""
    import trafilatura

    dedup = (dedup_cache if dedup_cache is not None else True) if cfg.deduplicate else False
    return trafilatura.extract(html, favor_precision=cfg.favor_precision, include_comments=False,
                               deduplicate=dedup, include_tables=cfg.include_tables,
                               include_links=cfg.include_links)


def resiliparse_text(html: str, cfg: ExtractConfig) -> str:
    """DCLM's extraction: resiliparse's main-content heuristics, block formatting kept, no alt texts."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    return extract_plain_text(HTMLTree.parse(html), preserve_formatting=True, main_content=True,
                              list_bullets=cfg.list_bullets, alt_texts=cfg.alt_texts, links=False,
                              form_fields=False, noscript=False, comments=False)


def page_title(html: str) -> str | None:
    """The first <title>'s text, entities decoded and white space collapsed; None if absent or empty."""
    m = TITLE_RE.search(html)
    title = " ".join(html_lib.unescape(m.group(1)).split()) if m else ""
    return title or None


class Crashed(Exception):
    """The child process running the backend died (segfault, out of memory)."""


class BackendError(Exception):
    """The backend raised inside the child process; the message is `ExceptionType: message`."""


def _serve(conn, fn: Callable[[str], str | None]) -> None:
    """The child's loop: one page in, (ok, text or error message) out, until the parent closes the pipe.
    None in: forget what the backend remembers of earlier pages (see Extractor.reset)."""
    while True:
        try:
            html = conn.recv()
        except (EOFError, OSError):
            return
        if html is None:
            _child_backends.clear()
            conn.send((True, None))
            continue
        try:
            result = (True, fn(html))
        except Exception as e:  # any backend failure on any page: reported, the loop goes on
            result = (False, f"{type(e).__name__}: {e}"[:300])
        conn.send(result)


class Sandbox:
    """Runs `fn(html)` in a persistent child process; a call over `timeout_s` kills it (TimeoutError) and
    the next call starts a fresh one. Errors inside `fn` come back as BackendError; a dead child as Crashed.

    The child comes from multiprocessing's fork server, not a fork of this process: a fork would inherit
    every descriptor open here (a run folder's writer lock, half-written outputs) and keep them as long as
    it lives, and would copy the threads' locks of a process that may be mid-write. `fn` is pickled."""

    def __init__(self, fn: Callable[[str], str | None], timeout_s: float):
        self.fn, self.timeout_s = fn, timeout_s
        self.process = self.conn = None

    def __call__(self, html: str) -> str | None:
        if self.process is None:
            ctx = multiprocessing.get_context("forkserver")
            self.conn, child = ctx.Pipe()
            self.process = ctx.Process(target=_serve, args=(child, self.fn), daemon=True)
            self.process.start()
            child.close()
        try:
            self.conn.send(html)
            answered = self.conn.poll(self.timeout_s)
            if answered:
                ok, value = self.conn.recv()
        except (EOFError, OSError) as e:
            self.close()
            raise Crashed(f"extractor process died ({type(e).__name__})") from None
        if not answered:
            self.close()
            raise TimeoutError(f"over {self.timeout_s:g} s")
        if not ok:
            raise BackendError(value)
        return value

    def close(self) -> None:
        if self.process is not None:
            self.conn.close()
            self.process.kill()
            self.process.join()
            self.process = self.conn = None


def backend_fn(cfg: ExtractConfig) -> Callable[[str], str | None]:
    """html -> text with `cfg`'s backend; a trafilatura one holds its own deduplication cache."""
    if cfg.backend == "resiliparse":
        importlib.import_module("resiliparse.extract.html2text")  # the optional `web` extra
        return functools.partial(resiliparse_text, cfg=cfg)
    from trafilatura.deduplication import LRU_SIZE, LRUCache

    return functools.partial(trafilatura_text, cfg=cfg, dedup_cache=LRUCache(maxsize=LRU_SIZE))


_child_backends: dict[str, Callable[[str], str | None]] = {}  # in a sandbox's child: one per configuration


def run_backend(cfg: ExtractConfig, html: str) -> str | None:
    """What a Sandbox child runs: `cfg`'s backend, built on the child's first page (its own dedup cache)."""
    key = repr(cfg)
    if key not in _child_backends:
        _child_backends[key] = backend_fn(cfg)
    return _child_backends[key](html)


class Extractor:
    """Main-content text of one HTML page at a time (see the module docstring for the promise)."""

    def __init__(self, cfg: ExtractConfig):
        cfg.validate()
        self.cfg = cfg
        self.counts: Counter[str] = Counter()
        self.last_skip: str | None = None
        self._fn = backend_fn(cfg)  # imports the backend now: a missing package fails here, not per page
        sandboxed = cfg.timeout_s > 0 and _can_fork()
        self._sandbox = Sandbox(functools.partial(run_backend, cfg), cfg.timeout_s) if sandboxed else None

    def _skip(self, reason: str, detail: str, url: str | None) -> None:
        self.counts[reason] += 1
        self.last_skip = f"{reason}: {detail}" + (f" ({url})" if url else "")
        return None

    def __call__(self, html: str, url: str | None = None) -> Extracted | None:
        """The page's main content and <title>, or None (counted, reason in `last_skip`). `url` only
        names the page in `last_skip`: neither reference pipeline passes it to its extractor."""
        self.last_skip = None
        if not isinstance(html, str):
            return self._skip("error", f"expected str, got {type(html).__name__}", url)
        limit = self.cfg.max_html_bytes
        if limit and (len(html) > limit or (len(html) * 4 > limit and len(html.encode("utf-8", "replace")) > limit)):
            return self._skip("too_big", f"{len(html.encode('utf-8', 'replace'))} bytes > max_html_bytes={limit}", url)
        try:
            text = self._sandbox(html) if self._sandbox else self._fn(html)
        except TimeoutError as e:
            return self._skip("timeout", f"{self.cfg.backend} ran {e} (timeout_s)", url)
        except Crashed as e:
            return self._skip("crashed", str(e), url)
        except BackendError as e:
            return self._skip("error", f"{self.cfg.backend}: {e}"[:300], url)
        except Exception as e:  # RecursionError, parser errors: never stop the run for one page
            return self._skip("error", f"{self.cfg.backend}: {type(e).__name__}: {e}"[:300], url)
        if not text or not text.strip():
            return self._skip("no_content", f"{self.cfg.backend} found no main content", url)
        if len(text) < self.cfg.min_chars:
            return self._skip("too_short", f"{len(text)} characters < min_chars={self.cfg.min_chars}", url)
        self.counts["extracted"] += 1
        return Extracted(text=text, title=page_title(html))

    def reset(self) -> None:
        """Forget the pages seen so far (trafilatura's `deduplicate` cache), here and in the child: what a
        page yields then depends only on the pages since the reset, not on which process saw what before."""
        self._fn = backend_fn(self.cfg)
        if self._sandbox is not None and self._sandbox.process is not None:
            try:
                self._sandbox(None)
            except (Crashed, TimeoutError, BackendError):
                self._sandbox.close()  # a fresh child remembers nothing either

    def close(self) -> None:
        """Stop the child process (also done at exit and when the extractor is garbage collected)."""
        if self._sandbox is not None:
            self._sandbox.close()

    def __enter__(self) -> Extractor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the daemon child dies with us anyway
            pass

    def __getstate__(self) -> dict:
        # Shipped to another process (Ray): configuration and counts travel, the child and caches do not.
        return {"cfg": self.cfg, "counts": self.counts}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cfg"])
        self.counts.update(state["counts"])


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


# ----------------------------------------------------------------------------- the benchmark's metric


def shingles(text: str, n: int = 4) -> Counter[tuple[str, ...]]:
    """The multiset of `n`-token shingles of `\\w+` tokens (a text under n tokens is one short shingle)."""
    tokens = TOKEN_RE.findall(text or "")
    return Counter(tuple(tokens[i:i + n]) for i in range(max(1, len(tokens) - n + 1)) if tokens[i:i + n])


def shingle_counts(predicted: str, truth: str, n: int = 4) -> tuple[float, float, float]:
    """(true positives, false positives, false negatives) over shingles, as counts."""
    pred, true = shingles(predicted, n), shingles(truth, n)
    tp = sum((pred & true).values())
    return float(tp), float(sum(pred.values()) - tp), float(sum(true.values()) - tp)


def _precision(tp: float, fp: float, fn: float) -> float:
    return 1.0 if fp == fn == 0 else 0.0 if tp == fp == 0 else tp / (tp + fp)


def _recall(tp: float, fp: float, fn: float) -> float:
    return 1.0 if fp == fn == 0 else 0.0 if tp == fn == 0 else tp / (tp + fn)


def shingle_scores(predicted: str, truth: str, n: int = 4) -> tuple[float, float, float]:
    """(precision, recall, F1) of `predicted` against `truth` at the `n`-token shingle level.

    precision = tp / (tp + fp), recall = tp / (tp + fn), F1 = 2PR / (P + R), where a shingle that occurs
    p times predicted and t times true adds min(p, t) to tp, max(0, p - t) to fp, max(0, t - p) to fn.
    Two empty texts score 1; an empty prediction of a non-empty truth scores 0."""
    tp, fp, fn = shingle_counts(predicted, truth, n)
    p, r = _precision(tp, fp, fn), _recall(tp, fp, fn)
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def mean_scores(pairs: Iterable[tuple[str, str]], n: int = 4) -> dict[str, float]:
    """The benchmark's corpus scores over (predicted, truth) pairs: precision averaged over pages with a
    prediction, recall over pages with a truth, F1 of the two means (evaluate.py's metrics_from_tp_fp_fns)."""
    counts = [shingle_counts(p, t, n) for p, t in pairs]
    precisions = [_precision(*c) for c in counts if c[0] + c[1] > 0]
    recalls = [_recall(*c) for c in counts if c[0] + c[2] > 0]
    p = sum(precisions) / len(precisions) if precisions else 0.0
    r = sum(recalls) / len(recalls) if recalls else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


__all__ = ["BACKENDS", "SKIP_REASONS", "BackendError", "Crashed", "ExtractConfig", "Extracted", "Extractor",
           "Sandbox", "mean_scores", "page_title", "resiliparse_text", "shingle_counts", "shingle_scores",
           "shingles", "trafilatura_text"]
