"""Gopher quality and repetition rules (Rae et al. 2021, Table A1), as datatrove implements them.

Each check returns the reason a document is removed, or None to keep it; the checks run in
datatrove's order and stop at the first failure, so the reasons match datatrove's too. Words are
`groundup.data.words.split_words` tokens, punctuation included (see that module).

The repetition rules count duplicated n-grams for n = 2..10. datatrove builds every n-gram as a
string; here each n-gram is a 64-bit rolling hash of word hashes computed with numpy, and only
n-grams that occur more than once are walked in Python, so a long document costs a few array
passes instead of ten million string joins.
"""

from __future__ import annotations

import re

import numpy as np

from groundup.data.curate_config import GopherQualityConfig, GopherRepetitionConfig, NgramRepetitionConfig
from groundup.data.hashing import window_hashes

# datatrove's PUNCTUATION_SET: ASCII and CJK punctuation, the C0/C1 controls and the sentence
# terminals of many scripts. A "symbol word" consists of these characters only.
_PUNCTUATION = set(
    "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»"
    "։؝؞؟۔܀܁܂߹࠷࠹࠽࠾।॥၊။።፧፨᙮᜵᜶។៕៖៙៚᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᭽᭾᰻᰼᱾᱿‼‽⁇⁈⁉⸮⸼⹓⹔。꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫﹒﹖﹗！．？｡"
    "𐩖𐩗𐽕𐽖𐽗𐽘𐽙𐾆𐾇𐾈𐾉𑁇𑁈𑂾𑂿𑃀𑃁𑅁𑅂𑅃𑇅𑇆𑇍𑇞𑇟𑈸𑈹𑈻𑈼𑊩𑑋𑑌𑗂𑗃𑗉𑗊𑗋𑗌𑗍𑗎𑗏𑗐𑗑𑗒𑗓𑗔𑗕𑗖𑗗𑙁𑙂𑜼𑜽𑜾𑥄𑥆𑩂𑩃𑪛𑪜𑱁𑱂𑻷𑻸𑽃𑽄𖩮𖩯𖫵𖬷𖬸𖭄𖺘𛲟𝪈"
) | {chr(c) for c in (*range(0, 9), *range(11, 32), *range(127, 160))}
_WORD_CLASS_NON_SYMBOL = 1  # has a character outside _PUNCTUATION
_WORD_CLASS_ALPHA = 2  # has a letter


class _WordClass(dict):
    """word -> class bits, computed once per distinct word and then looked up from C via `map`."""

    def __missing__(self, word: str) -> int:
        bits = (_WORD_CLASS_NON_SYMBOL if any(c not in _PUNCTUATION for c in word) else 0) | (
            _WORD_CLASS_ALPHA if any(c.isalpha() for c in word) else 0)
        if len(self) > 1 << 20:
            self.clear()
        self[word] = bits
        return bits


_word_class = _WordClass()


def word_arrays(words: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class bits, lengths, per-process 64-bit hashes) of each word, as numpy arrays."""
    n = len(words)
    classes = np.fromiter(map(_word_class.__getitem__, words), dtype=np.uint8, count=n)
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=n)
    # Python's str hash is salted per process, which is fine: these hashes only compare n-grams
    # within one document. (MinHash, which compares across processes, uses xxhash.)
    hashes = np.fromiter(map(hash, words), dtype=np.int64, count=n).view(np.uint64)
    return classes, lengths, hashes


def gopher_quality(text: str, words: list[str], cfg: GopherQualityConfig) -> str | None:
    classes, lengths, _ = word_arrays(words)
    n_words = len(words)
    non_symbol = (classes & _WORD_CLASS_NON_SYMBOL).astype(bool)
    n_non_symbol = int(non_symbol.sum())
    if cfg.min_doc_words and n_non_symbol < cfg.min_doc_words:
        return "short_doc"
    if cfg.max_doc_words and n_non_symbol > cfg.max_doc_words:
        return "long_doc"
    if n_words == 0:
        return "short_doc"  # only reachable with min_doc_words = 0; datatrove divides by zero here
    mean_len = float(lengths[non_symbol].mean()) if n_non_symbol else float("nan")
    if cfg.min_avg_word_length and mean_len < cfg.min_avg_word_length:
        return "below_avg_word_length"
    if cfg.max_avg_word_length and mean_len > cfg.max_avg_word_length:
        return "above_avg_word_length"
    if cfg.max_symbol_word_ratio and text.count("#") / n_words > cfg.max_symbol_word_ratio:
        return "too_many_hashes"
    if cfg.max_symbol_word_ratio and (text.count("...") + text.count("…")) / n_words > cfg.max_symbol_word_ratio:
        return "too_many_ellipsis"
    lines = text.splitlines()
    if lines and cfg.max_bullet_lines_ratio:
        bullets = sum(1 for s in lines if s.lstrip().startswith(("•", "-")))
        if bullets / len(lines) > cfg.max_bullet_lines_ratio:
            return "too_many_bullets"
    if lines and cfg.max_ellipsis_lines_ratio:
        ends = sum(1 for s in lines if s.rstrip().endswith(("...", "…")))
        if ends / len(lines) > cfg.max_ellipsis_lines_ratio:
            return "too_many_end_ellipsis"
    if cfg.min_alpha_words_ratio:
        alpha = int(np.count_nonzero(classes & _WORD_CLASS_ALPHA))
        if alpha / n_words < cfg.min_alpha_words_ratio:
            return "below_alpha_words_ratio"
    if cfg.min_stop_words and len(set(cfg.stop_words).intersection(words)) < cfg.min_stop_words:
        return "too_few_stop_words"
    return None


# ----------------------------------------------------------------------------- repetition

_PARAGRAPHS = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")


def _duplicates(items: list[str]) -> tuple[int, int]:
    """Elements seen before and their characters (datatrove's find_duplicates)."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def _top_ngram_chars(grams: np.ndarray, chars: np.ndarray) -> int:
    """Characters of the most frequent n-gram times its count; ties go to the n-gram seen first,
    as with collections.Counter.most_common(1)."""
    _, first, counts = np.unique(grams, return_index=True, return_counts=True)
    best = counts.max()
    i = first[counts == best].min()
    return int(chars[i]) * int(best)


def _greedy_duplicate_chars(grams: np.ndarray, chars: np.ndarray, n: int) -> int:
    """datatrove's find_all_duplicate: scan left to right; an n-gram seen before adds its
    characters and the scan jumps past it (so overlapping repeats are not counted twice).

    Only n-grams occurring twice or more can ever be "seen before", so the scan visits those
    positions alone; the jump rule is the same.
    """
    _, inverse, counts = np.unique(grams, return_inverse=True, return_counts=True)
    candidates = np.flatnonzero(counts[inverse] > 1)
    if candidates.size == 0:
        return 0
    ids, sizes = inverse[candidates].tolist(), chars[candidates].tolist()
    seen: set[int] = set()
    total = 0
    next_pos = 0
    for pos, gid, size in zip(candidates.tolist(), ids, sizes):
        if pos < next_pos:
            continue
        if gid in seen:
            total += size
            next_pos = pos + n
        else:
            seen.add(gid)
            next_pos = pos + 1
    return total


def gopher_repetition(text: str, words: list[str], cfg: GopherRepetitionConfig) -> str | None:
    if not text:
        return "empty"
    paragraphs = _PARAGRAPHS.split(text.strip())
    count, chars = _duplicates(paragraphs)
    if cfg.dup_para_frac and count / len(paragraphs) > cfg.dup_para_frac:
        return "dup_para_frac"
    if cfg.dup_para_char_frac and chars / len(text) > cfg.dup_para_char_frac:
        return "dup_para_char_frac"
    lines = _LINES.split(text)
    count, chars = _duplicates(lines)
    if cfg.dup_line_frac and count / len(lines) > cfg.dup_line_frac:
        return "dup_line_frac"
    if cfg.dup_line_char_frac and chars / len(text) > cfg.dup_line_char_frac:
        return "dup_line_char_frac"
    _, lengths, hashes = word_arrays(words)
    cumulative = np.concatenate(([0], np.cumsum(lengths)))
    for n, frac in zip(cfg.top_ngram_sizes, cfg.top_ngram_fracs):
        if len(words) < n:
            continue
        joined = cumulative[n:] - cumulative[:-n] + (n - 1)  # n-gram joined with spaces
        if _top_ngram_chars(window_hashes(hashes, n), joined) / len(text) > frac:
            return f"top_{n}_gram"
    for n, frac in zip(cfg.dup_ngram_sizes, cfg.dup_ngram_fracs):
        if len(words) < n:
            continue
        concatenated = cumulative[n:] - cumulative[:-n]  # datatrove joins these without spaces
        if _greedy_duplicate_chars(window_hashes(hashes, n), concatenated, n) / len(text) > frac:
            return f"duplicated_{n}_n_grams"
    return None


def ngram_repetition(words: list[str], cfg: NgramRepetitionConfig) -> str | None:
    """Remove a document when more than `max_repeated_fraction` of its word n-grams (punctuation
    left out) already occurred earlier in it: boilerplate, spam and generated loops."""
    classes, _, hashes = word_arrays(words)
    hashes = hashes[(classes & _WORD_CLASS_NON_SYMBOL).astype(bool)]
    if len(hashes) < cfg.n:
        return None
    grams = window_hashes(hashes, cfg.n)
    repeated = 1.0 - len(np.unique(grams)) / len(grams)
    return "repeated_ngrams" if repeated > cfg.max_repeated_fraction else None
