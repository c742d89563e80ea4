"""Reading crawl files: FastWARC against warcio on the same files, and groundup's `iter_pages` on top.

    .venv/bin/python benchmarks/warc_read.py [--pages 2000] [--repeat 3] > warc_read.json

Needs the `web` extra. Pages are made from the embedded corpus (Shakespeare, cut into ~20 KB pieces, reused as needed, and
wrapped in HTML with navigation and a footer) and written by `groundup.corpus.crawl` as Common Crawl lays
files out: WARC (gzip, one member per record, and uncompressed; warcinfo, then request, response and metadata
records per page), WET (gzip) and ARC (gzip). Each reader streams every file and reads each HTML payload whole
(WET: each conversion record):

- `fastwarc`: `fastwarc.warc.ArchiveIterator`, HTTP parsed, payload encodings decoded;
- `warcio`: `warcio.archiveiterator.ArchiveIterator`, `content_stream().read()`;
- `groundup`: `groundup.data.web.warc.iter_pages` (FastWARC for WARC/WET, warcio for ARC, plus its damage checks
  and the browser's charset decoding of every page).

Charset detection is measured on its own, on undeclared pages: English in UTF-8, and pages of French, Russian
and Japanese sentences in windows-1252, KOI8-R and Shift_JIS (100 each), guessed by resiliparse's
`detect_encoding` (uchardet) and by charset-normalizer; `correct` is the share decoded back to the original text. Prints one JSON object: per format, each reader's median pages/s and MB/s (MB = 10^6 bytes of
the file on disk) over --repeat runs; the detector table; the load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from groundup.corpus import chunk_text  # noqa: E402
from groundup.corpus.crawl import CrawlResponse, write_arc, write_warc, write_wet  # noqa: E402
from groundup.corpus.shakespeare import iter_shakespeare  # noqa: E402
from groundup.data.web.charset import clean_decode, whatwg_encoding  # noqa: E402
from groundup.data.web.warc import WarcStats, iter_pages  # noqa: E402

HTML = ("<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title></head><body>"
        "<nav><a href=\"/\">Home</a> | <a href=\"/plays\">Plays</a></nav><main><h1>{title}</h1>{paras}</main>"
        "<footer>Public domain text. <a href=\"/about\">About</a></footer></body></html>")


def make_pages(n: int) -> list[tuple[str, str, str]]:
    """(url, title, text) for n pages cut from the works of Shakespeare (about 520 pieces, reused as needed
    under other URLs)."""
    pieces = [(work["id"].split("/")[-1], piece) for work in iter_shakespeare()
              for piece in chunk_text(work["text"], 20_000)]
    return [(f"https://shakespeare.example/{name}/{i}", name, text)
            for i, (name, text) in zip(range(n), itertools.cycle(pieces))]


def html_of(title: str, text: str) -> str:
    paras = "".join(f"<p>{p}</p>\n" for p in text.split("\n\n") if p.strip())
    return HTML.format(title=title, paras=paras)


def read_fastwarc(path: Path) -> int:
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    n = 0
    for record in ArchiveIterator(open(path, "rb"), record_types=WarcRecordType.response | WarcRecordType.conversion,
                                  auto_decode="all"):
        if record.record_type == WarcRecordType.conversion or record.http_content_type == "text/html":
            record.reader.read()
            n += 1
    return n


def read_warcio(path: Path) -> int:
    from warcio.archiveiterator import ArchiveIterator

    n = 0
    with open(path, "rb") as f:
        for record in ArchiveIterator(f):
            if record.rec_type == "conversion" or (record.rec_type == "response" and record.http_headers and
                                                   (record.http_headers.get_header("Content-Type") or "")
                                                   .startswith("text/html")):
                record.content_stream().read()
                n += 1
    return n


def read_groundup(path: Path) -> int:
    stats = WarcStats()
    n = sum(1 for _ in iter_pages(path, stats))
    assert not stats.examples(), stats.examples()
    return n


def time_reader(fn, path: Path, repeat: int, expect: int) -> dict:
    seconds = []
    for _ in range(repeat):
        t = time.perf_counter()
        try:
            n = fn(path)
        except Exception as e:  # FastWARC reads no ARC
            return {"error": f"{type(e).__name__}: {e}"}
        seconds.append(time.perf_counter() - t)
        if n != expect:
            return {"error": f"read {n} pages, expected {expect}"}
    s = statistics.median(seconds)
    return {"pages_per_s": round(expect / s, 1), "mb_per_s": round(path.stat().st_size / 1e6 / s, 1),
            "seconds": round(s, 4)}


SENTENCES = {  # text native to each encoding, for the detectors (pages of shuffled sentences)
    "windows-1252": ["Le café où nous déjeunions était fermé.", "Ça coûte très cher, même à Noël.",
                     "L'élève a reçu une lettre de sa sœur aînée.", "Où est la bibliothèque ? Près de l'hôtel."],
    "koi8-r": ["Привет, как дела?", "Сегодня хорошая погода, и мы идём гулять.", "Москва - столица России.",
               "Он читал книгу весь вечер.", "Мы встретимся завтра утром у вокзала."],
    "shift_jis": ["こんにちは、お元気ですか。", "今日は天気がいいので散歩に行きます。", "東京は日本の首都です。",
                  "彼は一晩中本を読んでいました。", "明日の朝、駅で会いましょう。"],
}


def detection_pages(pages: list[tuple[str, str, str]], per_encoding: int = 100) -> list[tuple[str, bytes]]:
    """(text, undeclared bytes) pages: English in UTF-8, then pages of native sentences in three encodings."""
    import random

    rnd = random.Random(0)
    out = [(t, t.encode("utf-8")) for t in (html_of(title, text).replace('<meta charset="utf-8">', "")
                                            for _, title, text in pages[:per_encoding])]
    for encoding, sentences in SENTENCES.items():
        for i in range(per_encoding):
            paras = ["".join(rnd.choice(sentences) + " " for _ in range(8)) for _ in range(rnd.randint(2, 12))]
            text = html_of(f"page {i}", "\n\n".join(paras)).replace('<meta charset="utf-8">', "")
            out.append((text, text.encode(encoding)))
    return out


def detectors(pages: list[tuple[str, str, str]], repeat: int) -> dict:
    from charset_normalizer import from_bytes
    from resiliparse.parse.encoding import detect_encoding

    cases = detection_pages(pages)

    def normalizer(data: bytes) -> str | None:
        best = from_bytes(data).best()
        return whatwg_encoding(best.encoding) if best is not None else None

    out = {}
    for name, detect in (("resiliparse", lambda b: detect_encoding(b, max_len=64 << 10)),
                         ("charset_normalizer", normalizer)):
        seconds = []
        for _ in range(repeat):
            t = time.perf_counter()
            guesses = [detect(data) for _, data in cases]
            seconds.append(time.perf_counter() - t)
        correct = sum(g is not None and clean_decode(data, g) == text for (text, data), g in zip(cases, guesses))
        s = statistics.median(seconds)
        out[name] = {"pages_per_s": round(len(cases) / s, 1), "correct": round(correct / len(cases), 4),
                     "pages": len(cases)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    pages = make_pages(args.pages)
    responses = [CrawlResponse(url, html_of(title, text).encode()) for url, title, text in pages]
    result: dict = {"pages": len(pages), "html_mb": round(sum(len(r.body) for r in responses) / 1e6, 1),
                    "repeat": args.repeat, "formats": {}}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"warc.gz": Path(tmp, "bench.warc.gz"), "warc": Path(tmp, "bench.warc"),
                 "wet.gz": Path(tmp, "bench.warc.wet.gz"), "arc.gz": Path(tmp, "bench.arc.gz")}
        write_warc(files["warc.gz"], responses)
        write_warc(files["warc"], responses, gzip=False)
        write_wet(files["wet.gz"], [(url, text) for url, _, text in pages])
        write_arc(files["arc.gz"], responses)
        for fmt, path in files.items():
            result["formats"][fmt] = {"file_mb": round(path.stat().st_size / 1e6, 1)} | {
                name: time_reader(fn, path, args.repeat, len(pages))
                for name, fn in (("fastwarc", read_fastwarc), ("warcio", read_warcio), ("groundup", read_groundup))}
    result["charset_detection"] = detectors(pages, args.repeat)
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
