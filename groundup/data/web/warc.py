"""Pages out of crawl files, streaming: HTML responses from WARC and ARC, text from WET. One bad record never
stops the run: it is counted in `WarcStats` with its file and byte offset, and reading goes on.

WARC and WET files are read with FastWARC, ARC files with warcio (FastWARC reads no ARC): on the same files
(`benchmarks/warc_read.py`) FastWARC read 2.6x warcio's pages/s from gzip WARC, 9x from plain WARC, 2x from
WET. Only `response` records
with an HTML content type (`WARC-Identified-Payload-Type` when the crawler wrote it, else the HTTP header) and
WET `conversion` records become pages; every record is counted by `WARC-Type`, other responses by content type.
HTTP chunked and gzip/deflate/brotli payload encodings are decoded by FastWARC; charsets by `charset.py`.

How damage is found and survived in a gzip file (one member per record, as Common Crawl writes them):
  - a record that reads past the end of its own gzip member has a Content-Length that lies (too long);
  - a record followed by bytes that are no WARC header inside its own member lies the other way (too short);
  - a member that stops before its end is truncated, one that does not inflate is unreadable;
after any of these, reading restarts at the next gzip member, found by its magic bytes and checked to inflate
to a WARC header. In an uncompressed file the same lies show as a next record that does not start where the
last one's Content-Length ends, and reading restarts at the next `WARC/1.x` line. A page is yielded only once
the record after it was found where it should be, so a page cut by a lying length is never yielded.

    stats = WarcStats()
    for page in iter_pages(Path("CC-MAIN-...warc.gz"), stats):
        page.html, page.url, page.offset
    stats.summary()
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from groundup.config import fail
from groundup.data.web.charset import decode_html

CRAWL_SUFFIXES = (".warc", ".warc.gz", ".arc", ".arc.gz", ".wet", ".wet.gz", ".warc.wet.gz")
HTML_TYPES = ("text/html", "application/xhtml+xml")
PROBLEMS = ("non_html", "undecodable", "truncated", "bad_length", "empty_files", "too_large", "unreadable")
POSITIONS_KEPT = 10  # positions ("FILE@OFFSET: reason") kept for each problem
_GZIP_MAGIC = b"\x1f\x8b\x08"


@dataclass
class WarcConfig:
    max_page_bytes: int = 8 << 20  # a page larger than this (its payload, once decoded) is skipped, counted too_large

    def validate(self, prefix: str = "warc") -> None:
        if not isinstance(self.max_page_bytes, int) or self.max_page_bytes < 1:
            fail(f"{prefix}.max_page_bytes", self.max_page_bytes, "a positive number of bytes")


def is_crawl_file(path: Path) -> bool:
    """Whether `path` names a WARC, ARC or WET file (optionally gzipped), by its name, case-insensitively."""
    return Path(path).name.lower().endswith(CRAWL_SUFFIXES)


@dataclass(frozen=True)
class Page:
    url: str
    record_id: str  # WARC-Record-ID (ARC has none: "<urn:arc:FILE@OFFSET>")
    date: str  # WARC-Date, ISO 8601
    file: str
    offset: int  # byte offset of the record (its gzip member) in the file
    html: str | None  # decoded HTML (response records)
    text: str | None  # text as the crawl holds it (WET conversion records)
    charset: str | None  # the Python codec the payload was decoded with
    charset_source: str | None  # "bom", "http", "meta" or "detected" (see charset.py); None for WET


@dataclass
class WarcStats:
    """What reading crawl files met: records by type, pages yielded, and each problem counted with the first
    `POSITIONS_KEPT` places it happened. JSON-serialisable (`to_dict`/`from_dict`) and mergeable across tasks."""

    files: int = 0
    records_by_type: dict[str, int] = field(default_factory=dict)
    pages: int = 0
    page_bytes: int = 0  # payload bytes of the pages yielded (after Content-Encoding is undone)
    non_html: int = 0  # response records whose content type is not HTML
    non_html_by_type: dict[str, int] = field(default_factory=dict)
    undecodable: int = 0  # HTML no charset decodes cleanly, or a payload encoding that does not decode
    truncated: int = 0  # a gzip member or record body that stops before its end
    bad_length: int = 0  # a Content-Length that lies
    empty_files: int = 0
    too_large: int = 0  # pages over max_page_bytes, skipped
    unreadable: int = 0  # files that cannot be opened or hold no WARC/ARC; gzip members that do not inflate
    charset_sources: dict[str, int] = field(default_factory=dict)
    positions: dict[str, list[str]] = field(default_factory=dict)

    def note(self, kind: str, where: str) -> None:
        """One more `kind` problem (one of PROBLEMS) at `where` ("FILE@OFFSET: reason")."""
        if kind not in PROBLEMS:
            raise ValueError(f"unknown crawl problem {kind!r}: expected one of {', '.join(PROBLEMS)}")
        setattr(self, kind, getattr(self, kind) + 1)
        kept = self.positions.setdefault(kind, [])
        if len(kept) < POSITIONS_KEPT:
            kept.append(where)

    def note_non_html(self, content_type: str, where: str) -> None:
        _bump(self.non_html_by_type, content_type or "unknown")
        self.note("non_html", where)

    def merge(self, other: WarcStats) -> WarcStats:
        for name in ("files", "pages", "page_bytes", *PROBLEMS):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("records_by_type", "non_html_by_type", "charset_sources"):
            for key, n in getattr(other, name).items():
                _bump(getattr(self, name), key, n)
        for kind, where in other.positions.items():
            kept = self.positions.setdefault(kind, [])
            kept.extend(where[: POSITIONS_KEPT - len(kept)])
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> WarcStats:
        return cls(**data)

    def examples(self, limit: int = 10) -> list[str]:
        """Up to `limit` problem positions, "kind FILE@OFFSET: reason", in PROBLEMS order."""
        return [f"{kind} {where}" for kind in PROBLEMS for where in self.positions.get(kind, [])][:limit]

    def summary(self) -> str:
        """One line: pages from files, records by type, then each problem that happened."""
        records = ", ".join(f"{n} {t}" for t, n in sorted(self.records_by_type.items()))
        problems = ", ".join(f"{getattr(self, k)} {k.replace('_', ' ')}" for k in PROBLEMS if getattr(self, k))
        line = f"{self.pages} pages from {self.files} crawl files (records: {records or 'none'})"
        return line + (f"; skipped: {problems}" if problems else "")


def _bump(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


def iter_pages(path: Path, stats: WarcStats, max_page_bytes: int = 8 << 20) -> Iterator[Page]:
    """The pages of one crawl file in file order: HTML responses (WARC, ARC) and conversion records (WET).
    Problems are counted in `stats`, never raised; a file that cannot be read at all counts as unreadable."""
    path = Path(path)
    stats.files += 1
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError as e:
        stats.note("unreadable", f"{path}@0: {e.strerror or e}")
        return
    if not head:
        stats.note("empty_files", f"{path}@0: zero-byte file")
        return
    if path.name.lower().endswith((".arc", ".arc.gz")):
        yield from _arc_pages(path, stats, max_page_bytes)
        return
    gz = head == _GZIP_MAGIC[:2]
    start: int | None = 0
    while start is not None:
        start = yield from _read_from(path, start, gz, stats, max_page_bytes)


class _Damage(Exception):
    """A record whose framing cannot be trusted: args (problem, reason); reading restarts after it."""


def _read_from(path: Path, start: int, gz: bool, stats: WarcStats, max_bytes: int):
    """Yield the pages from byte `start` on; return where to restart after damage, or None at the end."""
    from fastwarc.stream_io import GzipReader
    from fastwarc.warc import ArchiveIterator

    with open(path, "rb") as f:
        f.seek(start)
        stream = GzipReader(f) if gz else f
        records = iter(ArchiveIterator(stream, parse_http=False, stream_detect=False))
        pending: tuple[Page, int] | None = None  # the last page, yielded once the next record is in place
        last: int | None = None  # offset of the last record read
        while True:
            try:
                record = next(records)
            except StopIteration:
                break
            except OSError as e:
                here = stream.frame_start_position() if gz else last
                if last is not None and here == last:  # the bytes after the last record are no WARC header
                    stats.note("bad_length", f"{path}@{last}: Content-Length does not end where the next "
                                             "record starts")
                    return _next_start(path, last + 1, gz)
                if pending is not None:
                    yield _emit(stats, *pending)
                here, found = (start if here is None else here), ("unreadable", f"no WARC record here ({e})")
                kind, reason = _member_damage(path, here, found) if gz else found
                stats.note(kind, f"{path}@{here}: {reason}")
                return _next_start(path, here + 1, gz)
            if pending is not None:
                yield _emit(stats, *pending)
                pending = None
            last = offset = stream.frame_start_position() if gz else record.stream_pos
            try:
                pending = _take(record, path, offset, stats, max_bytes)
                if gz and stream.frame_start_position() != offset:
                    raise _Damage("bad_length", "Content-Length runs past the end of the record's gzip member")
            except (_Damage, OSError) as e:
                pending = None
                payload = ("undecodable", f"payload Content-Encoding does not decode ({e})")
                found = e.args if isinstance(e, _Damage) else payload
                kind, reason = _member_damage(path, offset, found) if gz else found
                stats.note(kind, f"{path}@{offset}: {reason}")
                return _next_start(path, offset + 1, gz)
    if last is not None and (damage := _last_record_damage(path, last, gz)) is not None:
        stats.note(damage[0], f"{path}@{last}: {damage[1]}")
        return _next_start(path, last + 1, gz)  # in an uncompressed file, the records a lying length swallowed
    if last is None and start == 0:
        stats.note("unreadable", f"{path}@0: no WARC record in the file")
    if pending is not None:
        yield _emit(stats, *pending)
    return None


def _take(record, path: Path, offset: int, stats: WarcStats, max_bytes: int) -> tuple[Page, int] | None:
    """Read one record whole; the page it holds (with its payload size), or None. Raises _Damage."""
    headers = record.headers
    length = headers.get("Content-Length")
    if length is None or not length.strip().isdigit():
        raise _Damage("unreadable", "WARC header without a valid Content-Length")
    kind = (headers.get("WARC-Type") or "unknown").strip().lower()
    _bump(stats.records_by_type, kind)
    where = f"{path}@{offset}"
    if kind not in ("response", "conversion"):
        record.consume()
        return None
    if kind == "response":
        record.parse_http(auto_decode="all")
        http_type = record.http_headers.get("Content-Type") if record.http_headers is not None else None
        mime = (headers.get("WARC-Identified-Payload-Type") or http_type or "").split(";")[0].strip().lower()
        if mime not in HTML_TYPES:
            record.consume()
            stats.note_non_html(mime, f"{where}: {mime or 'no content type'}")
            return None
    if record.content_length > max_bytes:
        record.consume()
        stats.note("too_large", f"{where}: {record.content_length} bytes > max_page_bytes {max_bytes}")
        return None
    body = record.reader.read(max_bytes + 1)  # an OSError here: a payload encoding or a gzip member is bad
    if len(body) > max_bytes:
        record.consume()
        stats.note("too_large", f"{where}: over max_page_bytes {max_bytes} once decoded")
        return None
    url = (headers.get("WARC-Target-URI") or "").strip("<> ")
    rid, date = headers.get("WARC-Record-ID") or "", headers.get("WARC-Date") or ""
    if kind == "conversion":
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            stats.note("undecodable", f"{where}: WET text is not UTF-8")
            return None
        return Page(url, rid, date, str(path), offset, None, text, "utf-8", None), len(body)
    return _html_page(url, rid, date, path, offset, body, http_type, stats)


def _html_page(url: str, rid: str, date: str, path: Path, offset: int, body: bytes, content_type: str | None,
               stats: WarcStats) -> tuple[Page, int] | None:
    decoded = decode_html(body, content_type)
    if decoded is None:
        stats.note("undecodable", f"{path}@{offset}: no charset decodes the page cleanly")
        return None
    html, encoding, source = decoded
    return Page(url, rid, date, str(path), offset, html, None, encoding, source), len(body)


def _emit(stats: WarcStats, page: Page, nbytes: int) -> Page:
    stats.pages += 1
    stats.page_bytes += nbytes
    if page.charset_source:
        _bump(stats.charset_sources, page.charset_source)
    return page


# ---------------------------------------------------------------- finding damage and the next record


def _inflate(f, offset: int, end: int | None = None, keep: int = 1 << 16) -> tuple[str, bytes, int]:
    """Inflate the gzip member at `offset` (reading no further than `end`): its state ("whole",
    "truncated", "unreadable: why"), its first `keep` bytes and its inflated size, never holding it whole."""
    f.seek(offset)
    inflater, head, total = zlib.decompressobj(31), bytearray(), 0
    while not inflater.eof:
        chunk = f.read(1 << 16 if end is None else min(1 << 16, end - f.tell()))
        if not chunk:
            return "truncated", bytes(head), total
        try:
            out = inflater.decompress(chunk)
        except zlib.error as e:
            return f"unreadable: {e}", bytes(head), total
        total += len(out)
        head += out[: max(0, keep - len(head))]
    return "whole", bytes(head), total


def _member_problem(state: str) -> tuple[str, str]:
    if state == "truncated":
        return "truncated", "gzip member ends before its end"
    return "unreadable", f"gzip member does not inflate ({state.split(': ', 1)[1]})"


def _member_damage(path: Path, offset: int, whole: tuple[str, str]) -> tuple[str, str]:
    """Why the gzip member at `offset` could not be read: (problem, reason); `whole` if it inflates."""
    with open(path, "rb") as f:
        state = _inflate(f, offset, _next_start(path, offset + 1, True))[0]
    return whole if state == "whole" else _member_problem(state)


def _last_record_damage(path: Path, offset: int, gz: bool) -> tuple[str, str] | None:
    """Whether the file's last record holds all the bytes its Content-Length claims (readers stop quietly
    at the end of the file): None if so, else (problem, reason)."""
    with open(path, "rb") as f:
        if gz:
            state, head, total = _inflate(f, offset)
            if state != "whole":
                return _member_problem(state)
        else:
            f.seek(offset)
            head, total = f.read(1 << 16), path.stat().st_size - offset
    end = head.find(b"\r\n\r\n")
    length = next((line.split(b":", 1)[1].strip() for line in head[:end].split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), b"")
    if end < 0 or not length.isdigit():
        return None  # counted already, when the record was read
    held = total - end - 4
    if held >= int(length):
        return None
    if gz:
        return "bad_length", f"Content-Length {int(length)} but the record holds {held} bytes"
    if _next_start(path, offset + 1, gz) is not None:
        return "bad_length", f"Content-Length {int(length)} runs over the next record to the end of the file"
    return "truncated", f"file ends inside the record (Content-Length {int(length)}, {held} bytes left)"


def _next_start(path: Path, after: int, gz: bool) -> int | None:
    """Offset of the first record start at or after `after`: a gzip member that inflates to a WARC header
    (gzip files), or a `WARC/1.x` line (uncompressed files); None if there is none."""
    marker = _GZIP_MAGIC if gz else b"\nWARC/1."
    with open(path, "rb") as f:
        pos = after
        while True:
            f.seek(pos)
            chunk = f.read(1 << 20)
            i = chunk.find(marker)
            while i >= 0:
                if gz and _starts_record(f, pos + i):
                    return pos + i
                if not gz and chunk[i + 8:i + 10] in (b"0\r", b"1\r"):
                    return pos + i + 1
                i = chunk.find(marker, i + 1)
            if len(chunk) < 1 << 20:
                return None
            pos += len(chunk) - 16  # a marker cut by the chunk's end is found in the next chunk


def _starts_record(f, offset: int) -> bool:
    """Whether the gzip member at `offset` inflates to the start of a WARC header (or to nothing yet)."""
    f.seek(offset)
    try:
        head = zlib.decompressobj(31).decompress(f.read(1024), 8)
    except zlib.error:
        return False
    return head.startswith(b"WARC/") if len(head) >= 5 else b"WARC/".startswith(head)


# ---------------------------------------------------------------- ARC, through warcio


def _arc_pages(path: Path, stats: WarcStats, max_bytes: int) -> Iterator[Page]:
    """The HTML responses of an ARC file. warcio cannot resynchronise inside ARC, so damage stops the file
    (counted with its offset)."""
    from warcio.archiveiterator import ArchiveIterator

    with open(path, "rb") as f:
        records = ArchiveIterator(f, arc2warc=False)
        it = iter(records)
        while True:
            offset = records.offset
            try:
                record = next(it)
                offset = records.offset
                page = _arc_record(record, path, offset, stats, max_bytes)
            except StopIteration:
                return
            except Exception as e:  # warcio raises many kinds on bad bytes (ArchiveLoadFailed, zlib, ValueError)
                stats.note("truncated" if isinstance(e, (EOFError, zlib.error)) else "unreadable",
                           f"{path}@{offset}: {type(e).__name__}: {str(e).strip()[:200]}; rest of file skipped")
                return
            if page is not None:
                yield _emit(stats, *page)


def _arc_record(record, path: Path, offset: int, stats: WarcStats, max_bytes: int) -> tuple[Page, int] | None:
    from warcio.timeutils import timestamp_to_iso_date

    headers, where = record.rec_headers, f"{path}@{offset}"
    http_type = record.http_headers.get_header("Content-Type") if record.http_headers else None
    mime = (http_type or headers.get_header("content-type") or "").split(";")[0].strip().lower()
    body = None
    if record.rec_type == "response" and mime in HTML_TYPES and (record.length or 0) <= max_bytes:
        body = record.content_stream().read(max_bytes + 1)
    else:
        while record.raw_stream.read(1 << 16):  # skipped without holding it whole
            pass
    if getattr(record.raw_stream, "limit", 0) > 0:
        raise EOFError(f"record ends {record.raw_stream.limit} bytes before its length field says")
    _bump(stats.records_by_type, "arcinfo" if record.rec_type == "arc_header" else record.rec_type)
    if record.rec_type != "response":
        return None
    if mime not in HTML_TYPES:
        stats.note_non_html(mime, f"{where}: {mime or 'no content type'}")
        return None
    if body is None or len(body) > max_bytes:
        stats.note("too_large", f"{where}: over max_page_bytes {max_bytes}")
        return None
    date = timestamp_to_iso_date(headers.get_header("archive-date") or "")
    return _html_page(headers.get_header("uri") or "", f"<urn:arc:{path.name}@{offset}>", date, path, offset,
                      body, http_type, stats)
