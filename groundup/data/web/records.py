"""Crawl files as text records: what `data/readers.py` yields for `.warc`, `.arc` and `.wet` inputs.

A page becomes a record with the fields every data stage reads (`id` = the WARC record id, `source`,
`domain`, `url`) and where it came from (`warc`: record id, date, file, offset). Its HTML is turned
into text in one of two places:

- `extract_record` (here), when a caller wants text at once: `data extract`, `tokenizer train`, the
  readers' default;
- the curator's first stage, when `data curate` reads the crawl: the reader then yields the record
  with its HTML in `text` and `format = "html"`, so that extraction, the costly step, runs in the
  worker processes or Ray tasks that curate the shard rather than in the one process that reads.

WET records are text already (Common Crawl's own extraction) and are yielded as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from groundup.data.web.extract import Extracted, ExtractConfig, Extractor
from groundup.data.web.language import LanguageIdentifier
from groundup.data.web.warc import Page, WarcStats, iter_pages

HTML_FORMAT = "html"  # `format` of a record whose `text` is a page's HTML, not yet extracted


def page_record(page: Page, source: str, domain: str) -> dict:
    """A crawl page as a record: text for WET pages, HTML (format "html") for the others."""
    record = {"id": page.record_id, "source": source, "domain": domain, "url": page.url,
              "warc": {"record_id": page.record_id, "date": page.date, "file": page.file, "offset": page.offset}}
    if page.text is not None:
        record["text"] = page.text
    else:
        record["text"] = page.html
        record["format"] = HTML_FORMAT
        if page.charset:
            record["warc"]["charset"] = page.charset
    return record


def iter_crawl_records(path: Path, source: str, domain: str, stats: WarcStats,
                       max_page_bytes: int) -> Iterator[dict]:
    """Every usable page of one crawl file, in file order; problems are counted in `stats`."""
    for page in iter_pages(path, stats, max_page_bytes):
        yield page_record(page, source, domain)


class RecordExtractor:
    """HTML records to text records: main content, title, and (optionally) language with its score.

    Built once per process: the extractor (its backend, its child process) and the language model load on
    the first page, so a curator that never meets HTML never loads them."""

    def __init__(self, cfg: ExtractConfig, identify_language: bool = True):
        self.cfg = cfg
        self.identify_language = identify_language
        self._extractor: Extractor | None = None
        self._identifier: LanguageIdentifier | None = None

    @property
    def extractor(self) -> Extractor:
        if self._extractor is None:
            self._extractor = Extractor(self.cfg)
        return self._extractor

    def reset(self) -> None:
        """Forget earlier pages (trafilatura's cross-page deduplication): called at each shard or file, so a
        page's text never depends on which worker process happened to read what before it."""
        if self._extractor is not None:
            self._extractor.reset()

    def skip_reason(self) -> str:
        """Why the last page gave no record: the extractor's reason (too_big, timeout, no_content, ...)."""
        skip = self._extractor.last_skip if self._extractor is not None else None
        return (skip or "no_content").split(":")[0]

    def language(self, text: str) -> tuple[str, float]:
        if self._identifier is None:
            self._identifier = LanguageIdentifier()
        return self._identifier.predict(text)

    def __call__(self, record: dict) -> dict | None:
        """The record with extracted `text` and `title` (HTML records), `language` and `language_score`;
        None when the page has no main content. Records that are text already pass through, tagged."""
        if record.get("format") == HTML_FORMAT:
            extracted: Extracted | None = self.extractor(record["text"], record.get("url"))
            if extracted is None:
                return None
            record = {k: v for k, v in record.items() if k != "format"}
            record["text"], record["title"] = extracted.text, extracted.title
        if self.identify_language and "language_score" not in record:
            record["language"], record["language_score"] = self.language(record["text"])
        return record
