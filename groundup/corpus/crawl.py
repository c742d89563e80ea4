"""Crawl files made here, for tests, benchmarks and examples: WARC as Common Crawl writes it, WET, ARC, and
the hostile files a real crawl contains.

`write_warc` lays records out as Common Crawl does: a `warcinfo` record, then for each page a `request`, its
`response` (with `WARC-Identified-Payload-Type`, which datatrove's reader and Common Crawl's tools read) and a
`metadata` record, each record its own gzip member. warcio writes the records (a maintained library), with
record ids derived from the URL and the date, so the same pages make the same bytes. warcio writes no ARC, so
`write_arc` lays out ARC v1 itself (a header line per record, which warcio's ARC reader checks in the tests).
`write_hostile` produces the broken files that a reader must survive; only their broken bytes are hand-made.

    write_warc(path, [CrawlResponse("https://example.com/", b"<html>...</html>")])
"""

from __future__ import annotations

import gzip as gziplib
import io
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from groundup.io import atomic_open

HOSTILE_KINDS = ("truncated", "truncated_middle", "corrupt", "long_length", "long_length_plain", "short_length",
                 "short_length_plain", "bad_encoding", "binary", "huge_page", "encoded", "empty", "not_warc")
_HTTP_REASONS = {200: "OK", 301: "Moved Permanently", 302: "Found", 404: "Not Found", 500: "Internal Server Error"}


@dataclass
class CrawlResponse:
    url: str
    body: bytes  # the payload exactly as stored (already compressed or chunked if `headers` say so)
    content_type: str = "text/html; charset=utf-8"  # HTTP Content-Type; "" writes no such header
    date: str = "2024-01-01T00:00:00Z"  # WARC-Date, ISO 8601
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()  # further HTTP headers (Content-Encoding, Transfer-Encoding, ...)


def _record_id(*parts: object) -> str:
    """A WARC-Record-ID that depends only on `parts`, so rewriting the same pages gives the same file."""
    return f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, '|'.join(map(str, parts)))}>"


def _mime(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def http_response_bytes(resp: CrawlResponse) -> bytes:
    """The HTTP message a crawler stores: status line, headers, blank line, payload."""
    lines = [f"HTTP/1.1 {resp.status} {_HTTP_REASONS.get(resp.status, 'Unknown')}"]
    if resp.content_type:
        lines.append(f"Content-Type: {resp.content_type}")
    names = {name.lower() for name, _ in resp.headers}
    if "transfer-encoding" not in names:
        lines.append(f"Content-Length: {len(resp.body)}")
    lines += [f"{name}: {value}" for name, value in resp.headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + resp.body


def _http_request_bytes(url: str) -> bytes:
    rest = url.split("://", 1)[-1]
    host, _, path = rest.partition("/")
    return (f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: groundup-test/1.0\r\n"
            "Accept: text/html,application/xhtml+xml\r\n\r\n").encode("latin-1")


def _warcinfo(writer, filename: str, date: str, software: str) -> tuple[str, object]:
    info = (f"software: {software}\r\nformat: WARC File Format 1.0\r\n"
            "conformsTo: http://bibnum.bnf.fr/WARC/WARC_ISO_28500_version1_latestdraft.pdf\r\n").encode()
    warcinfo_id = _record_id("warcinfo", filename, date)
    record = writer.create_warc_record("", "warcinfo", payload=io.BytesIO(info), length=len(info),
                                       warc_content_type="application/warc-fields",
                                       warc_headers_dict={"WARC-Record-ID": warcinfo_id, "WARC-Date": date,
                                                          "WARC-Filename": filename})
    return warcinfo_id, record


def write_warc(path: str | Path, responses: Iterable[CrawlResponse], gzip: bool = True,
               metadata: bool = True) -> None:
    """A WARC file of `responses`: warcinfo, then request, response (and metadata) per page, one gzip member
    per record when `gzip`. Written under a temporary name and renamed into place."""
    from warcio.warcwriter import WARCWriter

    path = Path(path)
    with atomic_open(path, "wb") as f:
        writer = WARCWriter(f, gzip=gzip)
        warcinfo_id, info = _warcinfo(writer, path.name, "2024-01-01T00:00:00Z", "groundup crawl writer")
        writer.write_record(info)
        for resp in responses:
            response_id = _record_id("response", resp.url, resp.date)
            request_id = _record_id("request", resp.url, resp.date)
            common = {"WARC-Date": resp.date, "WARC-Warcinfo-ID": warcinfo_id, "WARC-IP-Address": "192.0.2.1"}
            request = _http_request_bytes(resp.url)
            writer.write_record(writer.create_warc_record(
                resp.url, "request", payload=io.BytesIO(request), length=len(request),
                warc_headers_dict={**common, "WARC-Record-ID": request_id, "WARC-Concurrent-To": response_id}))
            http = http_response_bytes(resp)
            headers = {**common, "WARC-Record-ID": response_id, "WARC-Concurrent-To": request_id}
            if resp.content_type:
                headers["WARC-Identified-Payload-Type"] = _mime(resp.content_type)
            writer.write_record(writer.create_warc_record(
                resp.url, "response", payload=io.BytesIO(http), length=len(http), warc_headers_dict=headers))
            if metadata:
                fields = b"fetchTimeMs: 100\r\n"
                writer.write_record(writer.create_warc_record(
                    resp.url, "metadata", payload=io.BytesIO(fields), length=len(fields),
                    warc_content_type="application/warc-fields",
                    warc_headers_dict={**common, "WARC-Record-ID": _record_id("metadata", resp.url, resp.date),
                                       "WARC-Concurrent-To": response_id}))


def write_wet(path: str | Path, pages: Iterable[tuple[str, str]], date: str = "2024-01-01T00:00:00Z",
              gzip: bool = True) -> None:
    """A WET file as Common Crawl writes it: warcinfo, then one `conversion` record (UTF-8 text/plain) per
    `(url, text)`, each referring to the response it was extracted from."""
    from warcio.warcwriter import WARCWriter

    path = Path(path)
    with atomic_open(path, "wb") as f:
        writer = WARCWriter(f, gzip=gzip)
        warcinfo_id, info = _warcinfo(writer, path.name, date, "groundup crawl writer (WET)")
        writer.write_record(info)
        for url, text in pages:
            data = text.encode("utf-8")
            writer.write_record(writer.create_warc_record(
                url, "conversion", payload=io.BytesIO(data), length=len(data), warc_content_type="text/plain",
                warc_headers_dict={"WARC-Date": date, "WARC-Record-ID": _record_id("conversion", url, date),
                                   "WARC-Refers-To": _record_id("response", url, date),
                                   "WARC-Warcinfo-ID": warcinfo_id, "WARC-Identified-Content-Language": "eng"}))


def _arc_date(iso: str) -> str:
    """ISO 8601 to ARC's 14-digit timestamp: 2024-01-01T00:00:00Z -> 20240101000000."""
    return "".join(ch for ch in iso if ch.isdigit())[:14].ljust(14, "0")


def write_arc(path: str | Path, responses: Iterable[CrawlResponse], gzip: bool = True) -> None:
    """An ARC v1 file (the Internet Archive's format before WARC): the `filedesc://` header record, then one
    record per response (`URL IP DATE MIME LENGTH` line, the HTTP message, a newline), each record its own
    gzip member when `gzip`. warcio reads ARC but cannot write it, so the few lines of layout are here."""
    path = Path(path)
    spec = b"1 0 groundup\nURL IP-address Archive-date Content-type Archive-length\n"
    records = [f"filedesc://{path.name} 0.0.0.0 20240101000000 text/plain {len(spec)}\n".encode() + spec + b"\n"]
    for resp in responses:
        http = http_response_bytes(resp)
        line = f"{resp.url} 192.0.2.1 {_arc_date(resp.date)} {_mime(resp.content_type) or '-'} {len(http)}\n"
        records.append(line.encode("latin-1") + http + b"\n")
    with atomic_open(path, "wb") as f:
        for record in records:
            f.write(gziplib.compress(record, mtime=0) if gzip else record)


def _raw_response(url: str, http: bytes, length: int | None = None) -> bytes:
    """One WARC response record by hand, with Content-Length `length` (the true length when None)."""
    rid = _record_id("response", url, "hostile")
    head = (f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: {rid}\r\nWARC-Date: 2024-01-01T00:00:00Z\r\n"
            f"WARC-Target-URI: {url}\r\nContent-Type: application/http; msgtype=response\r\n"
            f"Content-Length: {len(http) if length is None else length}\r\n\r\n")
    return head.encode("latin-1") + http + b"\r\n\r\n"


def _page(n: int, kind: str) -> CrawlResponse:
    body = f"<html><head><title>{kind} {n}</title></head><body><p>Page {n} of the {kind} file.</p></body></html>"
    return CrawlResponse(f"https://example.com/{kind}/{n}", body.encode())


def write_hostile(path: str | Path, kind: str) -> None:
    """A crawl file with one known defect. Every kind but "empty" and "not_warc" holds good pages
    `https://example.com/KIND/1` and `.../2` around the bad record (`.../99`, or the named URLs); gzip files
    hold one member per record, "_plain" kinds are uncompressed.

    truncated          the bad record's gzip member is cut halfway, and the file ends there (after page 2)
    truncated_middle   the same member cut halfway, between pages 1 and 2
    corrupt            the bad record's gzip member has flipped bytes in the middle, so it does not inflate
    long_length(_plain)   its Content-Length claims 1000 bytes more than the record holds
    short_length(_plain)  its Content-Length is 30 bytes short
    bad_encoding       its HTTP payload says Content-Encoding gzip but is not gzip
    binary             a PNG image (.../logo.png) and a PDF (.../paper.pdf)
    huge_page          a 10 MiB page on one line (.../huge)
    encoded            no bad record: .../gzip has gzip Content-Encoding, .../chunked chunked Transfer-Encoding
    empty              a zero-byte file
    not_warc           a text file that holds no crawl record
    """
    if kind not in HOSTILE_KINDS:
        raise ValueError(f"hostile kind {kind!r}: expected one of {', '.join(HOSTILE_KINDS)}")
    path = Path(path)
    base = f"https://example.com/{kind}"
    if kind in ("empty", "not_warc"):
        with atomic_open(path, "wb") as f:
            f.write(b"" if kind == "empty" else b"This is not a crawl file.\n" * 20)
        return
    middle = {
        "binary": [CrawlResponse(f"{base}/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "image/png"),
                   CrawlResponse(f"{base}/paper.pdf", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj<<>>endobj\n%%EOF\n",
                                 "application/pdf")],
        "huge_page": [CrawlResponse(f"{base}/huge", b"<html><body><p>" + b"word " * (2 << 20) + b"</p></body></html>")],
        "encoded": [CrawlResponse(f"{base}/gzip", gziplib.compress(_page(1, kind).body, mtime=0),
                                  headers=(("Content-Encoding", "gzip"),)),
                    CrawlResponse(f"{base}/chunked", _chunked(_page(1, kind).body),
                                  headers=(("Transfer-Encoding", "chunked"),))],
    }
    if kind in middle:
        write_warc(path, [_page(1, kind), *middle[kind], _page(2, kind)])
        return
    _write_broken(path, kind, base)


def _chunked(data: bytes, size: int = 40) -> bytes:
    """`data` in HTTP/1.1 chunked transfer coding."""
    chunks = [data[i:i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def _write_broken(path: Path, kind: str, base: str) -> None:
    """The hostile files whose defect lies in the bytes of one record, between warcio-written pages."""
    from warcio.warcwriter import WARCWriter

    gz = not kind.endswith("_plain")
    http = http_response_bytes(_page(99, kind))
    if kind == "bad_encoding":
        http = http_response_bytes(CrawlResponse(f"{base}/99", b"this is not gzip " * 8,
                                                 headers=(("Content-Encoding", "gzip"),)))
    length = {"long": len(http) + 1000, "short": len(http) - 30}.get(kind.split("_")[0])
    bad = _raw_response(f"{base}/99", http, length)
    if gz:
        bad = gziplib.compress(bad, mtime=0)
    if kind.startswith("truncated"):
        bad = bad[: len(bad) // 2]
    elif kind == "corrupt":
        mid = len(bad) // 2
        bad = bad[:mid] + bytes(b ^ 0xFF for b in bad[mid:mid + 8]) + bad[mid + 8:]
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=gz)
    writer.write_record(_warcinfo(writer, path.name, "2024-01-01T00:00:00Z", "groundup hostile writer")[1])
    for n in (1, 2):
        if n == 2 and kind != "truncated":
            buf.write(bad)
        resp = _page(n, kind)
        payload = http_response_bytes(resp)
        writer.write_record(writer.create_warc_record(
            resp.url, "response", payload=io.BytesIO(payload), length=len(payload),
            warc_headers_dict={"WARC-Date": resp.date, "WARC-Record-ID": _record_id("response", resp.url, n),
                               "WARC-Identified-Payload-Type": "text/html"}))
    if kind == "truncated":
        buf.write(bad)
    with atomic_open(path, "wb") as f:
        f.write(buf.getvalue())
