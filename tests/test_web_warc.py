"""Reading crawl files (groundup/data/web/warc.py, charset.py) and writing them (groundup/corpus/crawl.py).

Pinned: pages, record ids, URLs and offsets equal warcio's own reading of the same files (WARC, ARC, WET); each
hostile file's pages and its one problem, counted with the exact file@offset (taken from warcio); the browser's
charset order (BOM, HTTP, meta, detection) and the WHATWG labels; WarcStats' merge, JSON and summary.
"""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("fastwarc")
pytest.importorskip("warcio")
pytest.importorskip("resiliparse")

from warcio.archiveiterator import ArchiveIterator  # noqa: E402

from groundup.corpus.crawl import (HOSTILE_KINDS, CrawlResponse, write_arc, write_hostile, write_warc,  # noqa: E402
                                   write_wet)
from groundup.data.web.charset import decode_html, prescan_meta, whatwg_encoding  # noqa: E402
from groundup.data.web.warc import PROBLEMS, Page, WarcConfig, WarcStats, is_crawl_file, iter_pages  # noqa: E402
from groundup.errors import ConfigError  # noqa: E402

PAGES = [CrawlResponse(f"https://example.com/{i}", f"<html><body><p>Page {i}: grüße, ✓</p></body></html>".encode(),
                       date=f"2024-01-0{i + 1}T00:00:00Z") for i in range(4)]


def warcio_records(path, types=("response",)):
    """(record type, url, record id, offset, payload) of each record warcio reads, up to its first error."""
    out = []
    with open(path, "rb") as f:
        it = ArchiveIterator(f)
        try:
            for record in it:
                body = record.content_stream().read()
                h = record.rec_headers
                out.append((record.rec_type, h.get_header("WARC-Target-URI") or h.get_header("uri"),
                            h.get_header("WARC-Record-ID"), it.get_record_offset(), it.get_record_length(), body))
        except Exception:
            pass
    return [r for r in out if r[0] in types] if types else out


def read(path, **kw):
    stats = WarcStats()
    return list(iter_pages(path, stats, **kw)), stats


def problems(stats: WarcStats) -> dict:
    return {k: getattr(stats, k) for k in PROBLEMS if getattr(stats, k)}


@pytest.mark.parametrize("name,expected", [
    ("CC-MAIN-1.warc.gz", True), ("a.WARC", True), ("a.arc", True), ("a.ARC.GZ", True), ("a.wet", True),
    ("a.wet.gz", True), ("CC-MAIN-1.warc.wet.gz", True), ("a.jsonl", False), ("a.warc.zst", False),
    ("warc.txt", False), ("a.gz", False)])
def test_is_crawl_file(tmp_path, name, expected):
    assert is_crawl_file(tmp_path / name) is expected


@pytest.mark.parametrize("gzip", [True, False])
def test_warc_pages_equal_warcios_reading(tmp_path, gzip):
    path = tmp_path / ("crawl.warc.gz" if gzip else "crawl.warc")
    write_warc(path, PAGES, gzip=gzip)
    pages, stats = read(path)
    ref = warcio_records(path)
    assert [(p.record_id, p.url, p.offset) for p in pages] == [(r[2], r[1], r[3]) for r in ref]
    assert [p.html.encode() for p in pages] == [r[5] for r in ref] == [r.body for r in PAGES]
    assert [p.date for p in pages] == [r.date for r in PAGES]
    assert {(p.file, p.text, p.charset, p.charset_source) for p in pages} == {(str(path), None, "utf-8", "http")}
    assert stats.records_by_type == {"warcinfo": 1, "request": 4, "response": 4, "metadata": 4}
    assert (stats.pages, stats.page_bytes, problems(stats)) == (4, sum(len(r.body) for r in PAGES), {})
    assert len(warcio_records(path, types=None)) == 13  # warcinfo, then request/response/metadata per page
    write_warc(tmp_path / "again" / path.name, PAGES, gzip=gzip)  # the same pages make the same bytes
    assert (tmp_path / "again" / path.name).read_bytes() == path.read_bytes()


@pytest.mark.parametrize("gzip", [True, False])
def test_arc_pages_equal_warcios_reading(tmp_path, gzip):
    path = tmp_path / ("old.arc.gz" if gzip else "old.arc")
    write_arc(path, PAGES, gzip=gzip)
    pages, stats = read(path)
    ref = warcio_records(path)
    assert [(p.url, p.offset) for p in pages] == [(r[1], r[3]) for r in ref]
    assert [p.html.encode() for p in pages] == [r.body for r in PAGES]
    assert [p.date for p in pages] == [r.date for r in PAGES]
    assert [p.record_id for p in pages] == [f"<urn:arc:{path.name}@{r[3]}>" for r in ref]
    assert stats.records_by_type == {"arcinfo": 1, "response": 4} and problems(stats) == {}


def test_wet_pages_equal_warcios_reading(tmp_path):
    path = tmp_path / "CC-MAIN-x.warc.wet.gz"
    texts = [("https://example.com/a", "First page.\nSecond line, grüße."), ("https://example.com/b", "日本語のテキスト")]
    write_wet(path, texts)
    pages, stats = read(path)
    ref = warcio_records(path, types=("conversion",))
    assert [(p.record_id, p.url, p.offset) for p in pages] == [(r[2], r[1], r[3]) for r in ref]
    assert [(p.url, p.text, p.html, p.charset, p.charset_source) for p in pages] == [
        (url, text, None, "utf-8", None) for url, text in texts]
    assert stats.records_by_type == {"warcinfo": 1, "conversion": 2} and problems(stats) == {}


def _where(path, offset):
    return f"{path}@{offset}"


def _bad_offset(path, kind):
    """Where the bad record starts, as warcio reads the file: its own offset, or (where warcio stops at the
    damaged member) the end of the record before it."""
    records = warcio_records(path, types=None)
    bad = [r for r in records if (r[1] or "").endswith("/99") or r[1] == "ht"]
    if bad:
        return bad[0][3]
    page1 = [r for r in records if (r[1] or "").endswith(f"{kind}/1")][0]
    return page1[3] + page1[4]


HOSTILE = {  # kind: (problem, count, start of its reason)
    "truncated": ("truncated", 1, "gzip member ends before its end"),
    "truncated_middle": ("truncated", 1, "gzip member ends before its end"),
    "corrupt": ("unreadable", 1, "gzip member does not inflate (Error -3"),
    "long_length": ("bad_length", 1, "Content-Length runs past the end of the record's gzip member"),
    "long_length_plain": ("bad_length", 1, "Content-Length 1199 runs over the next record to the end of the file"),
    "short_length": ("bad_length", 1, "Content-Length does not end where the next record starts"),
    "short_length_plain": ("bad_length", 1, "Content-Length does not end where the next record starts"),
    "bad_encoding": ("undecodable", 1, "payload Content-Encoding does not decode"),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_damaged_record_is_counted_at_its_offset_and_reading_goes_on(tmp_path, kind):
    path = tmp_path / (f"{kind}.warc" if kind.endswith("_plain") else f"{kind}.warc.gz")
    write_hostile(path, kind)
    pages, stats = read(path)
    assert [p.url for p in pages] == [f"https://example.com/{kind}/1", f"https://example.com/{kind}/2"]
    assert [p.html for p in pages] == [f"<html><head><title>{kind} {n}</title></head><body><p>Page {n} of the "
                                       f"{kind} file.</p></body></html>" for n in (1, 2)]
    problem, count, reason = HOSTILE[kind]
    assert problems(stats) == {problem: count}
    assert len(stats.positions[problem]) == 1
    assert stats.positions[problem][0].startswith(f"{_where(path, _bad_offset(path, kind))}: {reason}")
    assert stats.pages == 2 and stats.files == 1


def test_binary_payloads_are_counted_by_content_type(tmp_path):
    path = tmp_path / "binary.warc.gz"
    write_hostile(path, "binary")
    pages, stats = read(path)
    assert [p.url.rsplit("/", 1)[1] for p in pages] == ["1", "2"]
    assert problems(stats) == {"non_html": 2}
    assert stats.non_html_by_type == {"image/png": 1, "application/pdf": 1}
    offsets = {r[1].rsplit("/", 1)[1]: r[3] for r in warcio_records(path)}
    assert stats.positions["non_html"] == [f"{path}@{offsets['logo.png']}: image/png",
                                           f"{path}@{offsets['paper.pdf']}: application/pdf"]
    assert stats.records_by_type == {"warcinfo": 1, "request": 4, "response": 4, "metadata": 4}


def test_zero_byte_and_non_crawl_files(tmp_path):
    empty, junk = tmp_path / "empty.warc.gz", tmp_path / "junk.warc"
    write_hostile(empty, "empty")
    write_hostile(junk, "not_warc")
    assert empty.stat().st_size == 0
    stats = WarcStats()
    assert list(iter_pages(empty, stats)) == [] and list(iter_pages(junk, stats)) == []
    assert list(iter_pages(tmp_path / "missing.warc", stats)) == []
    assert problems(stats) == {"empty_files": 1, "unreadable": 2} and stats.files == 3
    assert stats.positions["empty_files"] == [f"{empty}@0: zero-byte file"]
    assert stats.positions["unreadable"][0] == f"{junk}@0: no WARC record here (Invalid WARC header)"
    assert stats.positions["unreadable"][1] == f"{tmp_path / 'missing.warc'}@0: No such file or directory"


def test_ten_megabyte_single_line_page(tmp_path):
    path = tmp_path / "huge.warc.gz"
    write_hostile(path, "huge_page")
    offset = [r[3] for r in warcio_records(path) if r[1].endswith("/huge")][0]
    pages, stats = read(path)
    assert [p.url.rsplit("/", 1)[1] for p in pages] == ["1", "2"]
    assert problems(stats) == {"too_large": 1}
    assert stats.positions["too_large"] == [f"{path}@{offset}: 10485793 bytes > max_page_bytes 8388608"]
    pages, stats = read(path, max_page_bytes=16 << 20)
    assert [p.url.rsplit("/", 1)[1] for p in pages] == ["1", "huge", "2"] and problems(stats) == {}
    huge = pages[1].html
    assert len(huge) == 10485793 and "\n" not in huge and huge.endswith("word </p></body></html>")


def test_payload_content_and_transfer_encodings_are_decoded(tmp_path):
    path = tmp_path / "encoded.warc.gz"
    write_hostile(path, "encoded")
    pages, stats = read(path)
    assert [p.url.rsplit("/", 1)[1] for p in pages] == ["1", "gzip", "chunked", "2"] and problems(stats) == {}
    assert pages[0].html == pages[1].html == pages[2].html


# ---------------------------------------------------------------- charsets

JAPANESE = "<html><body><p>東京は日本の首都です。こんにちは、お元気ですか。</p></body></html>"
FRENCH = ("<html><body><p>" + "Le café où nous déjeunions était fermé. Ça coûte très cher, même à Noël. "
          "L'élève a reçu une lettre de sa cousine aînée. " * 3 + "</p></body></html>")
META_1252 = ('<html><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1252"></head>'
             "<body><p>“Naïve” café – 10 €</p></body></html>")


def test_pages_in_several_charsets(tmp_path):
    garbage = bytes(random.Random(0).randrange(256) for _ in range(3000))
    cases = [  # (url, body, HTTP Content-Type, expected (text, codec, source) or None)
        ("utf8", "<p>Grüße ✓</p>".encode(), "text/html; charset=utf-8", ("<p>Grüße ✓</p>", "utf-8", "http")),
        ("meta1252", META_1252.encode("cp1252"), "text/html", (META_1252, "cp1252", "meta")),
        ("sjis", JAPANESE.encode("shift_jis"), "text/html; charset=Shift_JIS", (JAPANESE, "shift_jis", "http")),
        ("bom", b"\xef\xbb\xbf" + "<p>Grüße</p>".encode(), "text/html; charset=windows-1252",
         ("<p>Grüße</p>", "utf-8", "bom")),
        ("latin1", FRENCH.encode("latin-1"), "text/html", (FRENCH, "cp1252", "detected")),
        ("garbage", garbage, "text/html", None),
    ]
    path = tmp_path / "charsets.warc.gz"
    write_warc(path, [CrawlResponse(f"https://example.com/{u}", b, ct) for u, b, ct, _ in cases])
    pages, stats = read(path)
    assert [(p.url.rsplit("/", 1)[1], (p.html, p.charset, p.charset_source)) for p in pages] == [
        (u, want) for u, _, _, want in cases if want is not None]
    for url, body, ct, want in cases:
        assert decode_html(body, ct) == want, url
    garbage_at = [r[3] for r in warcio_records(path) if r[1].endswith("/garbage")][0]
    assert problems(stats) == {"undecodable": 1}
    assert stats.positions["undecodable"] == [f"{path}@{garbage_at}: no charset decodes the page cleanly"]
    assert stats.charset_sources == {"http": 2, "meta": 1, "bom": 1, "detected": 1}


@pytest.mark.parametrize("label,codec", [
    ("iso-8859-1", "cp1252"), ("latin1", "cp1252"), ("ascii", "cp1252"), ("US-ASCII", "cp1252"),
    (" Windows-1252 ", "cp1252"), ("utf8", "utf-8"), ("x-sjis", "shift_jis"), ("gb2312", "gbk"),
    ("koi8-r", "koi8-r"), ("bogus", None), ("", None)])
def test_labels_map_as_the_whatwg_encoding_standard(label, codec):
    assert whatwg_encoding(label) == codec
    if codec == "cp1252":  # "latin-1" on the wire is windows-1252: 0x93 is a curly quote
        assert decode_html(b"\x93caf\xe9\x94", f"text/html; charset={label}") == ("“café”", "cp1252", "http")


def test_declared_encoding_that_does_not_fit_falls_to_the_next_source():
    body = '<meta charset="windows-1251"><p>Привет, как дела? Сегодня хорошая погода.</p>'.encode("cp1251")
    assert decode_html(body, "text/html; charset=utf-8")[1:] == ("cp1251", "meta")  # not UTF-8: the meta wins
    assert decode_html("<p>x</p>".encode("utf-16-le"), "text/html; charset=utf-16") == ("<p>x</p>", "utf-16-le",
                                                                                       "http")


PRESCAN = [  # (head, the HTML standard's answer); resiliparse's meta scan agrees except where marked
    (b'<html><head><meta charset="shift_jis"></head>', "shift_jis"),
    (b'<!-- <meta charset="shift_jis"> --><p>hi</p>', None),
    (b'<meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">', "cp1252"),
    (b"<meta content='text/html; charset=koi8-r' http-equiv=content-type>", "koi8-r"),
    (b"<p>" + b"x" * 1100 + b"<meta charset=koi8-r>", None),  # past the first 1024 bytes
    (b"<META CHARSET=KOI8-R>", "koi8-r"),
    (b'<meta content="text/html; charset=koi8-r">', None),  # content without http-equiv does not count
    (b'<div title="<meta charset=koi8-r>">', None),  # inside another tag's attribute
    (b"<title><meta charset=koi8-r></title>", "koi8-r"),
    (b"<meta http-equiv=content-type content=\"charset='euc-jp'\">", "euc_jp"),
    (b"<meta charset=utf-16>", "utf-8"),  # standard: a prescanned UTF-16 label means UTF-8 (resiliparse: utf-16-le)
    (b"<meta charset=bogus><meta charset=koi8-r>", "koi8-r"),  # standard: go on (resiliparse stops at the first)
]


@pytest.mark.parametrize("head,want", PRESCAN)
def test_meta_prescan_follows_the_html_standard(head, want):
    from resiliparse.parse.encoding import detect_encoding

    assert prescan_meta(head) == want
    if want is not None and b"utf-16" not in head and b"bogus" not in head:
        assert detect_encoding(head, from_html_meta=True) == want  # resiliparse's own meta scan agrees


# ---------------------------------------------------------------- stats


def test_stats_merge_json_summary_and_examples():
    a, b = WarcStats(files=1, pages=3, records_by_type={"response": 3}), WarcStats(files=2, pages=1)
    for i in range(12):
        a.note("truncated", f"a.warc.gz@{i}: cut")
    b.note("truncated", "b.warc.gz@5: cut")
    b.note_non_html("image/png", "b.warc.gz@9: image/png")
    b.records_by_type = {"response": 2, "request": 2}
    with pytest.raises(ValueError, match="unknown crawl problem 'bogus'"):
        a.note("bogus", "x")
    assert a.truncated == 12 and len(a.positions["truncated"]) == 10
    merged = WarcStats.from_dict(json.loads(json.dumps(a.to_dict()))).merge(b)
    assert merged.to_dict() == a.merge(b).to_dict()
    assert (merged.files, merged.pages, merged.truncated, merged.non_html) == (3, 4, 13, 1)
    assert merged.records_by_type == {"response": 5, "request": 2}
    assert merged.non_html_by_type == {"image/png": 1}
    assert merged.positions["truncated"] == [f"a.warc.gz@{i}: cut" for i in range(10)]
    assert merged.summary() == ("4 pages from 3 crawl files (records: 2 request, 5 response); "
                                "skipped: 1 non html, 13 truncated")
    assert merged.examples(2) == ["non_html b.warc.gz@9: image/png", "truncated a.warc.gz@0: cut"]
    assert WarcStats().summary() == "0 pages from 0 crawl files (records: none)"


def test_page_is_frozen():
    page = Page("u", "<urn:x>", "2024-01-01T00:00:00Z", "f", 0, "<p>", None, "utf-8", "http")
    with pytest.raises(AttributeError):
        page.url = "v"


def test_every_hostile_kind_is_tested():
    assert set(HOSTILE_KINDS) == set(HOSTILE) | {"binary", "huge_page", "encoded", "empty", "not_warc"}


def test_config_names_the_key():
    WarcConfig().validate()
    with pytest.raises(ConfigError, match=r"^web.max_page_bytes = 0: expected a positive number of bytes$"):
        WarcConfig(max_page_bytes=0).validate("web")


@pytest.mark.parametrize("name", ["fuzz.warc.gz", "fuzz.warc", "fuzz.arc.gz"])
def test_randomly_damaged_files_never_raise_and_gzip_pages_stay_whole(tmp_path, name):
    """Bits flipped, spans cut and junk inserted at random: reading never raises or loops, and a page read
    from a gzip file (whose members carry a CRC) is always the page that was written."""
    pages = [CrawlResponse(f"https://example.com/{i}", f"<p>page {i} {'x' * (i * 97 % 2000)}</p>".encode())
             for i in range(30)]
    clean = tmp_path / name
    (write_arc if ".arc" in name else write_warc)(clean, pages, gzip=name.endswith(".gz"))
    written, data = {p.url: p.body.decode() for p in pages}, clean.read_bytes()
    for seed in range(40):
        rnd, damaged = random.Random(seed), bytearray(data)
        for _ in range(rnd.randint(1, 4)):
            at, op = rnd.randrange(len(damaged)), rnd.random()
            if op < 0.4:
                damaged[at] ^= 1 << rnd.randrange(8)
            elif op < 0.7:
                del damaged[at:at + rnd.randint(1, 500)]
            else:
                damaged[at:at] = rnd.randbytes(rnd.randint(1, 50))
        path = tmp_path / f"{seed}.{name}"
        path.write_bytes(bytes(damaged))
        read_pages, stats = read(path)
        assert len(read_pages) <= 30 and stats.files == 1
        if name.endswith(".gz"):
            assert all(p.html == written[p.url] for p in read_pages), seed
