"""Each curation filter on crafted documents just inside and just outside its threshold."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from groundup.data import code_filters, gopher, web_filters
from groundup.data.curate_config import (C4Config, CodeFilterConfig, FineWebConfig, GopherQualityConfig,
                                         GopherRepetitionConfig, MathFilterConfig, NgramRepetitionConfig,
                                         URLFilterConfig)
from groundup.data.normalize import normalize_text
from groundup.data.web.url_lists import URLBlocker
from groundup.data.words import split_words

QUALITY = GopherQualityConfig()


def quality(text: str, **overrides) -> str | None:
    return gopher.gopher_quality(text, split_words(text), dataclasses.replace(QUALITY, **overrides))


def prose(n: int, word: str = "cat") -> str:
    """n words, two of them stop words, all alphabetic."""
    return " ".join(["the", "and"] + [word] * (n - 2))


# ----------------------------------------------------------------------------- words


def test_split_words_follows_spacy_english_rules():
    assert split_words("Don't stop, Mr. Smith's dog... (well-known) #tag $10 x[::2]") == [
        "Do", "n't", "stop", ",", "Mr.", "Smith", "'s", "dog", "...", "(", "well", "-", "known", ")", "#", "tag",
        "$", "10", "x[::2", "]"]  # as spaCy 3.8 splits it
    assert split_words("def f(x):\n    return x") == ["def", "f(x", "):", "return", "x"]  # "):" is an emoticon


# ----------------------------------------------------------------------------- Gopher quality


def test_gopher_word_count_bounds():
    assert quality(prose(50)) is None
    assert quality(prose(49)) == "short_doc"
    assert quality(prose(60), max_doc_words=60) is None
    assert quality(prose(61), max_doc_words=60) == "long_doc"


def test_gopher_mean_word_length_bounds():
    assert quality(prose(50)) is None  # every word has 3 letters: mean exactly 3.0
    assert quality(prose(49) + " ab") == "below_avg_word_length"
    ten = " ".join(["the", "and"] + ["abcdefghijklmnopq"] * 2 + ["abcdefghij"] * 46)  # mean exactly 10.0
    assert quality(ten) is None
    assert quality(ten + "k") == "above_avg_word_length"


def test_gopher_symbol_ratio():
    base = prose(50)
    assert quality(base + " #" * 5) is None  # 5 / 55 words
    assert quality(base + " #" * 6) == "too_many_hashes"  # 6 / 56 > 0.1
    assert quality(base + " ..." * 6) == "too_many_ellipsis"


def test_gopher_bullet_and_ellipsis_lines():
    line = "the cat and the dog sat"
    nine = "\n".join(["- " + line] * 9 + [line])
    assert quality(nine) is None  # 9 of 10 lines are bullets: 0.9 is allowed
    assert quality("\n".join(["- " + line] * 10)) == "too_many_bullets"
    three = "\n".join([line + " ..."] * 3 + [line] * 7)
    assert quality(three) is None
    assert quality("\n".join([line + " ..."] * 4 + [line] * 6)) == "too_many_end_ellipsis"


def test_gopher_alphabetic_words_and_stop_words():
    assert quality(prose(40) + " 123" * 10) is None  # 40 / 50 words have a letter: 0.8 exactly
    assert quality(prose(40) + " 123" * 11) == "below_alpha_words_ratio"
    assert quality(" ".join(["the"] + ["cat"] * 49)) == "too_few_stop_words"


def test_gopher_removes_verse_punctuation_and_code_as_published():
    # the damage docs/architecture.md describes: punctuation tokens count as words
    verse = "HAMLET. O, that this too too solid flesh would melt, thaw, and resolve itself into a dew!\n" * 3
    assert quality(verse * 4) == "below_alpha_words_ratio"
    code = "def f(x):\n    return x + 1  # add one to the value and return it\n" * 10
    assert quality(code) is not None


# ----------------------------------------------------------------------------- Gopher repetition


def _reference_repetition(text: str, cfg: GopherRepetitionConfig) -> str | None:
    """datatrove's GopherRepetitionFilter, string by string, to check the vectorised port."""
    import re

    def dups(xs):
        seen, n, c = set(), 0, 0
        for x in xs:
            if x in seen:
                n, c = n + 1, c + len(x)
            else:
                seen.add(x)
        return n, c

    paragraphs = re.split(r"\n{2,}", text.strip())
    n, c = dups(paragraphs)
    if cfg.dup_para_frac and n / len(paragraphs) > cfg.dup_para_frac:
        return "dup_para_frac"
    if cfg.dup_para_char_frac and c / len(text) > cfg.dup_para_char_frac:
        return "dup_para_char_frac"
    lines = re.split(r"\n+", text)
    n, c = dups(lines)
    if cfg.dup_line_frac and n / len(lines) > cfg.dup_line_frac:
        return "dup_line_frac"
    if cfg.dup_line_char_frac and c / len(text) > cfg.dup_line_char_frac:
        return "dup_line_char_frac"
    words = split_words(text)
    for n, frac in zip(cfg.top_ngram_sizes, cfg.top_ngram_fracs):
        grams = [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
        if grams:
            gram, count = Counter(grams).most_common(1)[0]
            if len(gram) * count / len(text) > frac:
                return f"top_{n}_gram"
    for n, frac in zip(cfg.dup_ngram_sizes, cfg.dup_ngram_fracs):
        seen, chars, i = set(), 0, 0
        while i < len(words) - n + 1:
            gram = "".join(words[i:i + n])
            if gram in seen:
                chars, i = chars + len(gram), i + n
            else:
                seen.add(gram)
                i += 1
        if chars / len(text) > frac:
            return f"duplicated_{n}_n_grams"
    return None


def test_gopher_repetition_matches_the_reference_on_random_repetitive_text():
    rng = random.Random(0)
    vocab = "the a cat dog sat on mat and ran far away home red blue big small".split()
    cfg = GopherRepetitionConfig()
    reasons = Counter()
    for _ in range(150):
        phrases = [" ".join(rng.choices(vocab, k=rng.randint(3, 9))) for _ in range(rng.randint(3, 30))]
        lines = [rng.choice(phrases[: rng.randint(1, len(phrases))]) + rng.choice([".", "!", ""]) for _ in range(20)]
        text = "\n".join(lines)
        expected = _reference_repetition(text, cfg)
        assert gopher.gopher_repetition(text, split_words(text), cfg) == expected, text
        reasons[expected] += 1
    assert len(reasons) >= 4  # the generated texts exercise several rules, and some pass


def _only(**kept) -> GopherRepetitionConfig:
    """A config with every rule off (0 disables, as in datatrove) except `kept`."""
    off = {"dup_line_frac": 0, "dup_para_frac": 0, "dup_line_char_frac": 0, "dup_para_char_frac": 0,
           "top_ngram_sizes": [], "top_ngram_fracs": [], "dup_ngram_sizes": [], "dup_ngram_fracs": []}
    return GopherRepetitionConfig(**{**off, **kept})


def test_gopher_duplicate_line_fraction_boundary():
    cfg = _only(dup_line_frac=0.3)
    unique = [f"line number {w} here" for w in "abcdefghij"]
    three = unique[:7] + unique[:3]  # 3 of 10 lines repeat earlier ones
    assert gopher.gopher_repetition("\n".join(three), [], cfg) is None
    four = unique[:6] + unique[:4]
    assert gopher.gopher_repetition("\n".join(four), [], cfg) == "dup_line_frac"


def test_gopher_top_ngram_and_duplicated_ngram_boundaries():
    cfg = _only(top_ngram_sizes=[2], top_ngram_fracs=[0.2])
    filler = " ".join(f"w{i:03d}" for i in range(60))  # 60 distinct words, 299 characters
    # "ab cd" (5 characters) n times: 5n / len(text) against 0.2
    for n, expected in ((16, None), (20, "top_2_gram")):
        text = filler + " " + " ".join(["ab cd x"] * n)
        assert gopher.gopher_repetition(text, split_words(text), cfg) == expected
    cfg = _only(dup_ngram_sizes=[5], dup_ngram_fracs=[0.15])
    # The second copy of a 5-word phrase repeats one 5-gram of 20 characters: 20 / 134 = 0.149
    # is kept, 20 / 133 = 0.150 is not.
    phrase = "aaaa bbbb cccc dddd eeee"
    for pad, expected in ((84, None), (83, "duplicated_5_n_grams")):
        text = f"{phrase} {phrase} " + "x" * pad
        assert gopher.gopher_repetition(text, split_words(text), cfg) == expected


def test_ngram_repetition_threshold():
    cfg = NgramRepetitionConfig(n=2, max_repeated_fraction=0.15)
    distinct = [f"w{i}" for i in range(20)]
    ok = distinct + distinct[:4]  # 23 bigrams, 3 repeated: 0.13
    assert gopher.ngram_repetition(ok, cfg) is None
    bad = distinct + distinct[:6]  # 25 bigrams, 5 repeated: 0.2
    assert gopher.ngram_repetition(bad, cfg) == "repeated_ngrams"


# ----------------------------------------------------------------------------- C4 and FineWeb


def test_c4_keeps_sentence_lines_and_needs_five_sentences():
    good = "\n".join(f"This is sentence number {i} here." for i in range(5))
    reason, text = web_filters.c4(good + "\nmenu home about\nClick here", C4Config())
    assert reason is None and text == good  # lines without terminal punctuation are dropped
    assert web_filters.c4("\n".join(good.splitlines()[:4]), C4Config())[0] == "too_few_sentences"
    assert web_filters.c4(good + "\nThe set {1, 2} is small.", C4Config())[0] == "curly_bracket"
    assert web_filters.c4(good + "\nLorem ipsum dolor sit amet.", C4Config())[0] == "lorem_ipsum"


def test_fineweb_rules():
    cfg = FineWebConfig()
    long = "a line that is long enough to not count as short"
    ends = [long + "."] * 1 + [long + " x" + str(i) for i in range(7)]  # 1 of 8 = 0.125 end in punctuation
    text = "\n".join(dict.fromkeys(ends))
    assert web_filters.fineweb(text, split_words(text), cfg) is None
    text = "\n".join([long + " y" + str(i) for i in range(9)])
    assert web_filters.fineweb(text, split_words(text), cfg) == "line_punct_ratio"
    short = "\n".join(["Short one."] * 1 + [f"Tiny {i}." for i in range(3)] + [long + "."])
    assert web_filters.fineweb(short, split_words(short), cfg) == "short_line_ratio"
    dup = "\n".join([long + "."] * 2 + [long + f" {i}." for i in range(5)])
    assert web_filters.fineweb(dup, split_words(dup), cfg) == "char_dup_ratio"


# ----------------------------------------------------------------------------- code and math


def test_code_filter_thresholds():
    cfg = CodeFilterConfig()
    body = "def add(first, second):\n    return first + second\n" * 5
    assert code_filters.code(body, {}, cfg) is None
    longer = body * 10
    assert code_filters.code(longer + "x = '" + "a" * 994 + "'\n", {}, cfg) is None  # a 1,000-character line
    assert code_filters.code(longer + "x = '" + "a" * 995 + "'\n", {}, cfg) == "long_line"
    assert code_filters.code(("y" * 101 + "\n") * 5, {}, cfg) == "long_mean_line"
    assert code_filters.code("# " + "+-*/ " * 20 + "\n" + body, {}, dataclasses.replace(cfg, min_alnum_fraction=0.6)) \
        == "low_alnum_fraction"
    assert code_filters.code("# Code generated by protoc. DO NOT EDIT.\n" + body, {}, cfg) == "generated_marker"
    upper = dataclasses.replace(cfg, generated_markers=["MAKE REGENERATES THIS"])  # a marker in any case matches
    assert code_filters.code("# make regenerates this\n" + body, {}, upper) == "generated_marker"
    assert code_filters.code(body, {"vendored": True}, cfg) == "vendored"
    assert code_filters.code(body, {"minified": True}, cfg) == "minified_path"
    assert code_filters.code("a = 1\n" * 50, {}, cfg) == "low_entropy"
    rng = random.Random(0)
    noise = "\n".join("".join(chr(rng.randint(33, 126)) for _ in range(80)) for _ in range(20))
    assert code_filters.code(noise, {}, cfg) == "high_entropy"


def test_math_filter():
    cfg = MathFilterConfig()
    problem = "Question: What is 12 + 5?\nSolution: 12 + 5 = 17.\nAnswer: 17"
    assert code_filters.math_doc(problem, cfg) is None
    assert code_filters.math_doc("Question: what is the answer to this?", cfg) == "too_few_digits"
    assert code_filters.math_doc("1+1", cfg) == "too_short"
    assert code_filters.math_doc(problem.replace("Answer", "Result"),
                                 dataclasses.replace(cfg, require_pattern=r"Answer:\s*-?\d+")) == "missing_pattern"


@pytest.mark.parametrize("url, reason", [
    ("https://blocked.example/page", "domain:blocked_domains"),
    ("https://www.blocked.example/page", "domain:blocked_domains"),
    ("https://notblocked.example/", None),
    ("https://site.test/casino/games", "banned_word"),
    ("https://freecasinoporn.test/", "banned_subword"),
    ("https://example.org/recipes", None),
])
def test_url_blocklist(url, reason):  # the rules against datatrove's URLFilter: tests/test_web_urls.py
    cfg = URLFilterConfig(blocked_domains=["blocked.example"], banned_subwords=["porn"])
    assert URLBlocker(cfg).check(url) == reason


# ----------------------------------------------------------------------------- normalisation


def test_normalize_keeps_indentation_and_fixes_endings_controls_and_unicode():
    text = "def f():\r\n\tif x:\r\n        return 'cafe\u0301'\x00\x1b\r\n"
    assert normalize_text(text) == "def f():\n\tif x:\n        return 'caf\u00e9'\n"
    assert normalize_text("a\rb") == "a\nb"
