"""C4 and FineWeb line-based quality rules for prose, as datatrove implements them.

C4 keeps only the lines that look like sentences and may drop the whole page; it is the one
filter that changes the text it keeps. FineWeb's rules judge the shape of the lines.
"""

from __future__ import annotations

import re

from groundup.data.curate_config import C4Config, FineWebConfig

_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
_END_PUNCTUATION = (".", "?", "!", '"', "'")
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
# datatrove counts sentences with spaCy's sentencizer; a terminal mark followed by a space or the
# end of the line is the same rule for ordinary prose.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?:\s|$)")
# FineWeb's stop characters: sentence terminals of the common scripts (datatrove uses the full
# Unicode Sentence_Terminal set; lines of prose in other scripts end in one of these too).
_TERMINAL = tuple(".!?։؟۔܀܁܂।॥။።፧፨។៕᠃᠉‼‽⁇⁈⁉。꓿꘎꘏！．？｡")


def c4(text: str, cfg: C4Config) -> tuple[str | None, str]:
    """Return (reason or None, the text of the kept lines)."""
    kept: list[str] = []
    sentences = 0
    for line in text.splitlines():
        line = line.strip()
        words = line.split()
        if cfg.max_word_length != -1 and any(len(w) > cfg.max_word_length for w in words):
            continue
        if cfg.remove_citations:
            line = _CITATION.sub("", line)
        if cfg.terminal_punctuation and (not line.endswith(_END_PUNCTUATION) or line.endswith("...")):
            continue
        if len(words) < cfg.min_words_per_line:
            continue
        lower = line.lower()
        if cfg.lorem_ipsum and "lorem ipsum" in lower:
            return "lorem_ipsum", text
        if cfg.javascript and "javascript" in lower:
            continue
        if cfg.curly_bracket and "{" in line:
            return "curly_bracket", text
        if cfg.policy and any(p in lower for p in _POLICY):
            continue
        sentences += max(1, len(_SENTENCE_END.findall(line)))
        kept.append(line)
    if sentences < cfg.min_sentences:
        return "too_few_sentences", text
    return None, "\n".join(kept).strip()


def fineweb(text: str, words: list[str], cfg: FineWebConfig) -> str | None:
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return "empty"
    ratio = sum(1 for line in lines if line.endswith(_TERMINAL)) / len(lines)
    if ratio < cfg.line_punct_thr and not (ratio == 0 and cfg.line_punct_exclude_zero):
        return "line_punct_ratio"
    if sum(1 for line in lines if len(line) <= cfg.short_line_length) / len(lines) > cfg.short_line_thr:
        return "short_line_ratio"
    seen: set[str] = set()
    duplicate_chars = 0
    for line in lines:
        if line in seen:
            duplicate_chars += len(line)
        else:
            seen.add(line)
    if duplicate_chars / max(1, len(text) - text.count("\n")) > cfg.char_duplicates_ratio:
        return "char_dup_ratio"
    if text.count("\n") / max(1, len(words)) > cfg.new_line_ratio:
        return "list_ratio"
    return None
