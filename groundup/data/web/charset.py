"""A page's bytes to text as a browser decodes them, or None when no encoding gives clean text.

The order is the HTML standard's (https://html.spec.whatwg.org/#determining-the-character-encoding):
a byte-order mark wins over everything, then the HTTP `Content-Type` charset, then a `<meta charset>` or
`<meta http-equiv="Content-Type" content="...; charset=...">` found by the standard's prescan of the first
1024 bytes, then detection (uchardet, through resiliparse). Labels are mapped as the WHATWG Encoding Standard
maps them (resiliparse's `map_encoding_to_html5`): "iso-8859-1", "latin1" and "ascii" all mean windows-1252,
"gb2312" means GBK, and an unknown label is no label.

One difference from a browser, on purpose: a browser decodes with the first encoding it finds and shows U+FFFD
for bytes that do not fit; a corpus should not hold those, so an encoding under which the bytes do not decode
cleanly (a strict decode fails, or the text is mostly control characters) is passed over for the next one.

    decode_html(b"<meta charset=koi8-r>...", "text/html")  ->  (text, "koi8-r", "meta")
"""

from __future__ import annotations

import functools
import re
from email.message import Message

SOURCES = ("bom", "http", "meta", "detected")  # where the encoding came from, in the order they are tried
PRESCAN_BYTES = 1024  # the HTML standard prescans this many bytes for a <meta> charset
DETECT_BYTES = 64 << 10  # bytes given to the detector: the first and last halves of a longer page
MAX_CONTROL_FRACTION = 0.01  # text with more control characters than this (or any NUL) is not clean text

_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xfe\xff", "utf-16-be"), (b"\xff\xfe", "utf-16-le"))
_SPACE = b"\t\n\x0c\r "
_CONTROL = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
_C1 = re.compile("[\x7f-\x9f]")
_C0_BYTES = bytes([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x20)])
_LETTER = re.compile(rb"[A-Za-z]")


@functools.lru_cache(maxsize=4096)
def whatwg_encoding(label: str | None) -> str | None:
    """The Python codec for an encoding label, mapped as the WHATWG Encoding Standard does; None if unknown."""
    if not label:
        return None
    from resiliparse.parse.encoding import map_encoding_to_html5

    return map_encoding_to_html5(label.strip(_SPACE.decode()).lower(), fallback_utf8=False)


@functools.lru_cache(maxsize=4096)  # a crawl has few distinct Content-Type values; parsing one is slow
def http_charset(content_type: str | None) -> str | None:
    """The `charset` parameter of an HTTP Content-Type header (quoted or not), or None."""
    if not content_type:
        return None
    msg = Message()
    msg["content-type"] = content_type
    charset = msg.get_param("charset")
    return charset if isinstance(charset, str) and charset else None


# ---------------------------------------------------------------- the HTML standard's prescan (13.2.3.2)


def _skip(data: bytes, pos: int, chars: bytes) -> int:
    while pos < len(data) and data[pos] in chars:
        pos += 1
    return pos


def _get_attribute(data: bytes, pos: int) -> tuple[str, str, int] | None:
    """The standard's "get an attribute": (name, value, next position), or None at `>` or the end."""
    n = len(data)
    pos = _skip(data, pos, _SPACE + b"/")
    if pos >= n or data[pos] == 0x3E:
        return None
    name = bytearray()
    while True:  # the name
        if pos >= n:
            return None
        c = data[pos]
        if c == 0x3D and name:  # =
            pos += 1
            break
        if c in _SPACE:
            pos = _skip(data, pos, _SPACE)
            if pos >= n:
                return None
            if data[pos] != 0x3D:
                return name.decode("latin-1"), "", pos
            pos += 1
            break
        if c in b"/>":
            return name.decode("latin-1"), "", pos
        name.append(c + 0x20 if 0x41 <= c <= 0x5A else c)
        pos += 1
    pos = _skip(data, pos, _SPACE)  # the value
    if pos >= n:
        return None
    value = bytearray()
    quote = data[pos]
    if quote in b"\"'":
        end = data.find(bytes([quote]), pos + 1)
        if end < 0:
            return None
        return name.decode("latin-1"), data[pos + 1:end].lower().decode("latin-1"), end + 1
    if quote == 0x3E:
        return name.decode("latin-1"), "", pos
    while pos < n and data[pos] not in _SPACE + b">":
        value.append(data[pos])
        pos += 1
    if pos >= n:
        return None
    return name.decode("latin-1"), value.lower().decode("latin-1"), pos


def charset_from_content(value: str) -> str | None:
    """The standard's "extract a character encoding from a meta element" on a `content` attribute value."""
    pos = 0
    while True:
        found = value.lower().find("charset", pos)
        if found < 0:
            return None
        pos = found + 7
        while pos < len(value) and value[pos] in "\t\n\x0c\r ":
            pos += 1
        if pos < len(value) and value[pos] == "=":
            break
    pos += 1
    while pos < len(value) and value[pos] in "\t\n\x0c\r ":
        pos += 1
    if pos >= len(value):
        return None
    if value[pos] in "\"'":
        end = value.find(value[pos], pos + 1)
        return value[pos + 1:end] if end > 0 else None
    return re.split(r"[\t\n\x0c\r ;]", value[pos:], maxsplit=1)[0]


def _meta_charset(data: bytes, pos: int) -> tuple[str | None, int]:
    """The attributes of a `<meta` tag starting at `pos`: the encoding they declare (or None), and the end."""
    seen: set[str] = set()
    got_pragma, need_pragma, charset = False, None, None
    while (attr := _get_attribute(data, pos)) is not None:
        name, value, pos = attr
        if name in seen:
            continue
        seen.add(name)
        if name == "http-equiv" and value == "content-type":
            got_pragma = True
        elif name == "content" and charset is None:
            encoding = whatwg_encoding(charset_from_content(value))
            if encoding is not None:
                charset, need_pragma = encoding, True
        elif name == "charset" and charset is None:
            charset, need_pragma = whatwg_encoding(value), False
    if need_pragma is None or (need_pragma and not got_pragma) or charset is None:
        return None, pos
    if charset in ("utf-16-le", "utf-16-be"):  # a document that can be prescanned is not UTF-16
        return "utf-8", pos
    return charset, pos


def prescan_meta(body: bytes) -> str | None:
    """The encoding declared by a `<meta>` in the first 1024 bytes, found by the HTML standard's prescan
    (comments skipped, other tags' attributes stepped over, the first usable declaration wins), or None."""
    data = body[:PRESCAN_BYTES]
    n, pos = len(data), 0
    while pos < n:
        if data.startswith(b"<!--", pos):
            end = data.find(b"-->", pos + 2)
            if end < 0:
                return None
            pos = end + 3
        elif data[pos:pos + 5].lower() == b"<meta" and pos + 5 < n and data[pos + 5] in _SPACE + b"/":
            encoding, pos = _meta_charset(data, pos + 6)
            if encoding is not None:
                return encoding
        elif data[pos] == 0x3C and (_LETTER.match(data, pos + 1) or
                                    (data.startswith(b"</", pos) and _LETTER.match(data, pos + 2))):
            pos += 1
            while pos < n and data[pos] not in _SPACE + b">":
                pos += 1
            while (attr := _get_attribute(data, pos)) is not None:
                pos = attr[2]
            pos += 1
        elif data.startswith((b"<!", b"</", b"<?"), pos):
            end = data.find(b">", pos)
            if end < 0:
                return None
            pos = end + 1
        else:
            pos += 1
    return None


# ---------------------------------------------------------------- detection and decoding


def detect_encoding(body: bytes) -> str:
    """uchardet's guess (through resiliparse), mapped as WHATWG does; UTF-8 when it cannot tell."""
    from resiliparse.parse.encoding import detect_encoding as detect

    return detect(body, max_len=DETECT_BYTES, html5_compatible=True)


def clean_decode(body: bytes, encoding: str) -> str | None:
    """`body` decoded strictly with `encoding`, or None if it does not decode or holds a NUL or too many
    control characters (C0 and C1, bar tab, newlines and form feed)."""
    try:
        text = body.decode(encoding)
    except (UnicodeDecodeError, LookupError):
        return None
    if encoding.startswith(("utf-16", "iso2022")):  # bytes are not characters here: count in the text
        controls = len(_CONTROL.findall(text))
    else:  # C0 bytes are C0 characters in every other encoding: counted in C, at memory speed
        controls = len(body) - len(body.translate(None, _C0_BYTES))
        if controls or not text.isascii():
            controls += len(_C1.findall(text))
    return None if "\x00" in text or controls > MAX_CONTROL_FRACTION * len(text) else text


def decode_html(body: bytes, content_type: str | None) -> tuple[str, str, str] | None:
    """(text, Python codec name, source) for an HTML payload; source is one of `SOURCES`. None when no
    candidate encoding (BOM, HTTP, meta, detected, in that order) decodes the bytes cleanly."""
    tried: set[str] = set()
    for source, encoding in _candidates(body, content_type):
        if encoding is None or encoding in tried:
            continue
        tried.add(encoding)
        start = len(body) - len(_strip_bom(body)) if source == "bom" else 0
        text = clean_decode(body[start:] if start else body, encoding)
        if text is not None:
            if text.startswith("\ufeff"):  # a BOM that agreed with the declared encoding
                text = text[1:]
            return text, encoding, source
    return None


def _strip_bom(body: bytes) -> bytes:
    for bom, _ in _BOMS:
        if body.startswith(bom):
            return body[len(bom):]
    return body


def _candidates(body: bytes, content_type: str | None):
    """(source, encoding) in the standard's order; each computed only if the ones before it failed."""
    for bom, encoding in _BOMS:
        if body.startswith(bom):
            yield "bom", encoding
            break
    yield "http", whatwg_encoding(http_charset(content_type))
    yield "meta", prescan_meta(body)
    yield "detected", detect_encoding(body)
