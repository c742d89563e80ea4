"""URL filtering: block lists (files, or UT1's category folders) and datatrove's word rules on the URL.

The promise: with `datatrove_exact = true`, `URLBlocker.check` blocks exactly the URLs that
datatrove 0.10.1's `URLFilter` blocks when it is given the same lists (its `extra_domains`,
`extra_urls`, `banned_words`, `soft_banned_words`, `banned_subwords`, `soft_word_threshold`;
`tests/test_web_urls.py` runs it beside this module). Its rules, in its order:

1. domain: the URL's registered domain (public-suffix aware, by tldextract) or its full host name
   is listed;
2. url: the URL, as a string, is listed;
3. banned_word: a banned word is one of the URL's words (the URL split on runs of characters other
   than ASCII letters and digits; the listed words are lowercased, with those characters removed);
4. soft_banned_words: at least `soft_word_threshold` different soft-banned words are among them;
5. banned_subword: a banned subword occurs anywhere in the URL lowercased and stripped to ASCII
   letters and digits ("freepornvideos" holds "porn").

By default (`datatrove_exact = false`) three of datatrove's gaps are closed, and the block set is a
superset of datatrove's: host names and words match in any case (datatrove lets "EXAMPLE.com" and
"PORN" through lists written in lowercase); a listed domain blocks all its subdomains, as UT1's lists
mean for squidGuard (datatrove matches only the registered domain or the exact host); and a listed
URL matches with or without its scheme (UT1 writes "host/path", which datatrove compares against
"http://host/path" and never matches).

A reason names the rule and, for lists, the list that matched ("domain:ut1/adult",
"url:my-list.txt", "banned_word"), so the report counts by list. List lines that are neither a domain
nor a URL are skipped and counted (`URLBlocker.bad_lines`); a list path that does not exist fails
at config time, naming the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Iterable, Iterator

from groundup.config import fail

INLINE_DOMAINS = "blocked_domains"  # the list name of URLFilterConfig.blocked_domains in reasons
INLINE_URLS = "blocked_urls"  # the list name of URLFilterConfig.blocked_urls
UT1_FILES = ("domains", "urls")  # what a UT1 category folder holds
MAX_BAD_LINE_EXAMPLES = 20

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9]+")  # datatrove's `normalizer`
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_HOST = re.compile(r"^(?:[\w-]+\.)+[\w-]+\.?$")  # dotted labels of letters (any script), digits, "-", "_"


def normalize_word(text: str) -> str:
    """datatrove's `normalize`: ASCII letters and digits only, lowercased."""
    return _NON_ALNUM.sub("", text).lower()


def _word_set(words: Iterable[str]) -> set[str]:
    """datatrove's `parse_list`: entries starting with "#" are commented out; the rest normalised."""
    return {normalize_word(w) for w in words if w and not w.startswith("#")}


@dataclass
class URLFilterConfig:
    """Drop documents by their `url` field (datatrove's URLFilter rules, plus block lists)."""

    moved_keys: ClassVar[dict[str, str]] = {
        "blocked_words": "renamed banned_words (datatrove's name)",
        "soft_words_min": "renamed soft_word_threshold; it counts the words of soft_banned_words",
    }

    enabled: bool = True  # drop documents whose `url` is blocked (documents without one pass); false = off
    # block-list files (one domain or URL a line, "#" comments) or UT1 folders (one folder per
    # category, each with `domains` and/or `urls`); empty = no lists
    block_lists: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)  # UT1 categories used, e.g. ["adult"]; empty = all
    blocked_domains: list[str] = field(default_factory=list)  # domains listed in the config (datatrove's extra_domains)
    blocked_urls: list[str] = field(default_factory=list)  # URLs listed here in the config (datatrove's extra_urls)
    # a URL with one of these among its words is blocked; empty = off
    banned_words: list[str] = field(default_factory=lambda: ["porn", "xxx", "casino", "viagra", "escort"])
    # a URL with soft_word_threshold different ones of these among its words is blocked; empty = off
    soft_banned_words: list[str] = field(default_factory=list)
    soft_word_threshold: int = 2  # how many different soft-banned words block a URL
    banned_subwords: list[str] = field(default_factory=list)  # blocked when one occurs anywhere in the URL; empty = off
    # true = datatrove's exact comparisons: hosts and words in the listed case only, a listed domain
    # matches a URL's registered domain or whole host, a listed URL the same string; false = any case,
    # every subdomain of a listed domain, listed URLs with or without their scheme
    datatrove_exact: bool = False

    def validate(self) -> None:
        folders = []
        for path in self.block_lists:
            if not Path(path).exists():
                fail("block_lists", self.block_lists, f"existing files or UT1 folders ({path} does not exist)")
            if Path(path).is_dir():
                if not ut1_categories(Path(path)):
                    fail("block_lists", self.block_lists,
                         f"files or UT1 folders ({path} has no category folder with {' or '.join(UT1_FILES)})")
                folders.append(Path(path))
        if self.categories:
            known = {c for folder in folders for c in ut1_categories(folder)}
            missing = [c for c in self.categories if c not in known]
            if missing:
                fail("categories", self.categories, "categories of the UT1 folders in block_lists"
                     + (f" (no {', '.join(missing)}; there are {', '.join(sorted(known))})" if known else ""))
        for key, kinds in ((INLINE_DOMAINS, ("domain",)), (INLINE_URLS, ("url",))):
            for entry in getattr(self, key):
                if classify_line(entry)[0] not in kinds:
                    fail(key, getattr(self, key), f"{kinds[0]}s ({entry!r} is not one)")
        for key in ("banned_words", "soft_banned_words", "banned_subwords"):
            if any(w and not w.startswith("#") and not normalize_word(w) for w in getattr(self, key)):
                fail(key, getattr(self, key), "words with at least one ASCII letter or digit")
        if self.soft_word_threshold < 1:
            fail("soft_word_threshold", self.soft_word_threshold,
                 "at least 1 (empty soft_banned_words turns the rule off)")


def ut1_categories(folder: Path) -> list[str]:
    """The category folders of a UT1 folder: those holding a `domains` or `urls` file, by name."""
    return sorted(p.name for p in folder.iterdir()
                  if p.is_dir() and any((p / name).is_file() for name in UT1_FILES))


def classify_line(line: str) -> tuple[str, str]:
    """("domain", host), ("url", url), ("blank", "") for blanks and "#" comments, or ("bad", why)."""
    entry = line.strip()
    if not entry or entry.startswith("#"):
        return "blank", ""
    if any(c.isspace() for c in entry):
        return "bad", "contains whitespace"
    scheme = _SCHEME.match(entry)
    if scheme or "/" in entry:
        rest = entry[scheme.end():] if scheme else entry.removeprefix("//")
        host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
        if host.startswith("["):  # an IPv6 address, then perhaps a port
            host = host[:host.find("]") + 1]
        if host.startswith("[") and host.endswith("]") and len(host) > 2 or _HOST.match(host.split(":", 1)[0]):
            return "url", entry
        return "bad", "not a URL with a host name"
    if _HOST.match(entry):
        return "domain", entry
    return "bad", "not a domain or URL"


def _strip_scheme(url: str) -> str:
    scheme = _SCHEME.match(url)
    return url[scheme.end():] if scheme else url.removeprefix("//")


class URLBlocker:
    """`check(url)`: why a URL is blocked, or None. Lists load on first use (once per process: the
    pickled blocker carries only its config, so Ray and spawned workers load their own)."""

    def __init__(self, cfg: URLFilterConfig):
        self.cfg = cfg
        self.banned_words = _word_set(cfg.banned_words)
        self.soft_banned_words = _word_set(cfg.soft_banned_words)
        subwords = sorted(_word_set(cfg.banned_subwords))
        self._subwords = re.compile("|".join(map(re.escape, subwords))) if subwords else None
        self._loaded = False
        self.domains: dict[str, str] = {}  # listed domain -> the list that named it first
        self.urls: dict[str, str] = {}  # listed URL -> the list that named it first
        self.entries: dict[str, int] = {}  # list name -> entries read
        self.bad_lines: dict[str, int] = {}  # list name -> lines skipped
        self.bad_line_examples: list[str] = []  # "file:line: why: text", the first few
        self._extract = None

    def __getstate__(self) -> dict:
        return {"cfg": self.cfg}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cfg"])

    # ------------------------------------------------------------------ loading

    def sources(self) -> Iterator[tuple[str, str, Iterable[str]]]:
        """(list name, file shown in messages, lines) for every list the config names."""
        yield INLINE_DOMAINS, "config", self.cfg.blocked_domains
        yield INLINE_URLS, "config", self.cfg.blocked_urls
        for path in map(Path, self.cfg.block_lists):
            if path.is_dir():
                for category in ut1_categories(path):
                    if self.cfg.categories and category not in self.cfg.categories:
                        continue
                    for name in UT1_FILES:
                        if (path / category / name).is_file():
                            yield f"{path.name}/{category}", str(path / category / name), _lines(path / category / name)
            else:
                yield path.name, str(path), _lines(path)

    def load(self) -> None:
        if self._loaded:
            return
        exact = self.cfg.datatrove_exact
        for name, file, lines in self.sources():
            for number, line in enumerate(lines, 1):
                kind, value = classify_line(line)
                if kind == "blank":
                    continue
                if kind == "bad":
                    self.bad_lines[name] = self.bad_lines.get(name, 0) + 1
                    if len(self.bad_line_examples) < MAX_BAD_LINE_EXAMPLES:
                        self.bad_line_examples.append(f"{file}:{number}: {value}: {line.strip()[:100]!r}")
                    continue
                self.entries[name] = self.entries.get(name, 0) + 1
                if kind == "domain":
                    self.domains.setdefault(value if exact else value.lower().rstrip("."), name)
                else:
                    self.urls.setdefault(value, name)
                    if not exact:
                        self.urls.setdefault(_strip_scheme(value), name)
        if self.domains:
            from tldextract import TLDExtract  # optional `web` dependency, needed for domain lists only

            # The public suffix list tldextract ships, never fetched: no network at run time.
            self._extract = TLDExtract(suffix_list_urls=(), cache_dir=None)
        self._loaded = True

    # ------------------------------------------------------------------ checking

    def _domain_match(self, url: str) -> str | None:
        info = self._extract(url)
        if self.cfg.datatrove_exact:
            registered = info.top_domain_under_public_suffix if hasattr(info, "top_domain_under_public_suffix") \
                else info.registered_domain
            for host in (registered, info.fqdn):
                if host in self.domains:
                    return self.domains[host]
            return None
        host = ".".join(part for part in (info.subdomain, info.domain, info.suffix) if part).rstrip(".")
        labels = host.split(".")
        for i in range(len(labels)):  # the host, then each parent domain
            name = self.domains.get(".".join(labels[i:]))
            if name is not None:
                return name
        return None

    def check(self, url: str) -> str | None:
        """Why `url` is blocked: "domain:LIST", "url:LIST", "banned_word", "soft_banned_words" or
        "banned_subword"; None when it passes."""
        self.load()
        exact = self.cfg.datatrove_exact
        cased = url if exact else url.lower()
        if self.domains:
            name = self._domain_match(cased)
            if name is not None:
                return f"domain:{name}"
        if self.urls:
            name = self.urls.get(url)
            if name is None and not exact:
                name = self.urls.get(_strip_scheme(url))
            if name is not None:
                return f"url:{name}"
        if self.banned_words or self.soft_banned_words:
            words = set(_NON_ALNUM.split(cased))
            if any(w in words for w in self.banned_words):
                return "banned_word"
            soft = sum(w in words for w in self.soft_banned_words)
            if self.soft_banned_words and soft >= self.cfg.soft_word_threshold:
                return "soft_banned_words"
        if self._subwords is not None and self._subwords.search(normalize_word(url)):
            return "banned_subword"
        return None


def _lines(path: Path) -> Iterator[str]:
    """A list file's lines; undecodable bytes become U+FFFD, so such a line is counted as bad."""
    with open(path, encoding="utf-8", errors="replace") as f:
        yield from f
