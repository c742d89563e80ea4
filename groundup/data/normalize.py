"""Text normalisation that never changes what code means.

Unicode NFC, C0/C1 control characters dropped (tab and newline kept), CRLF and CR turned into LF.
Leading whitespace, tabs and trailing spaces are left alone: indentation is syntax in Python and
YAML, and a Markdown line break is two trailing spaces.
"""

from __future__ import annotations

import re
import unicodedata

import xxhash

# Everything in C0 and C1 except tab (\x09) and newline (\x0a), plus DEL and the byte-order mark;
# \r is handled by the line-ending rule so that "a\rb" becomes two lines, not "ab".
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufeff]")


def normalize_text(text: str, nfc: bool = True, control_chars: bool = True, line_endings: bool = True) -> str:
    # Each step first checks whether it has anything to do: on clean text (nearly all of it)
    # normalisation then costs one scan per rule instead of a copy per rule.
    if line_endings and "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if control_chars and _CONTROL.search(text):
        text = _CONTROL.sub("", text)
    if nfc and not text.isascii() and not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    return text


def exact_key(text: str) -> int:
    """The exact-duplicate key: a 64-bit hash of the normalised text without outer whitespace.

    Inner whitespace is kept on purpose: two code files that differ only in indentation are
    different programs.
    """
    return xxhash.xxh3_64_intdigest(text.strip().encode("utf-8", errors="surrogatepass"))
