"""Word tokenisation for the prose filters, the same as datatrove's English word splitter.

datatrove (and so FineWeb) counts Gopher's "words" with spaCy's blank English tokenizer: text is
split at whitespace, then each piece loses prefixes ("(", quotes, "$") and suffixes (",", ".",
"'s", ")") one at a time, unless what is left is a special case ("don't" -> "do", "n't"; "Mr.";
emoticons such as "):"), and the rest is split at infixes (hyphens between letters, "...").
Punctuation is therefore counted as words, which is why the alphabetic-word rule removes so much
verse and all code. We port that algorithm (MIT-licensed spaCy rules, letter classes simplified
to Latin, Greek and Cyrillic) so that our filter decisions agree with datatrove's without spaCy
as a dependency; `benchmarks/curate.py` measures the agreement.

Tokenising a whitespace piece is cached: prose repeats its pieces, so most cost one dict lookup.
"""

from __future__ import annotations

import re
from itertools import chain

_LOWER = "a-z\u00df-\u00f6\u00f8-\u00ff\u0101\u0103\u0105\u0107\u0113\u011b\u012b\u0142\u0144\u014d\u0153\u015b\u0161\u016b\u017c\u017e\u03b1-\u03c9\u0430-\u044f\u0451"
_UPPER = "A-Z\u00c0-\u00d6\u00d8-\u00de\u0100\u0102\u0104\u0106\u0112\u011a\u012a\u0141\u0143\u014c\u0152\u015a\u0160\u016a\u017b\u017d\u0391-\u03a9\u0410-\u042f\u0401"
_ALPHA = _LOWER + _UPPER
_PUNCT = r"… …… , : ; \! \? ¿ ؟ ¡ \( \) \[ \] \{ \} < > _ # \* & 。 ？ ！ ， 、 ； ： ～ · । ، ۔ ؛ ٪".split(" ")
_QUOTES = r"\' \" ” “ ` ‘ ´ ’ ‚ , „ » « 「 」 『 』 （ ） 〔 〕 【 】 《 》 〈 〉 〈 〉 ⟦ ⟧".split(" ")
_QUOTE_CLASS = "".join(_QUOTES)
_HYPHENS = "|".join("- – — -- --- —— ~".split(" "))
_CURRENCY = r"\$ £ € ¥ ฿ US\$ C\$ A\$ ₽ ﷼ ₴ ₠ ₡ ₢ ₣ ₤ ₥ ₦ ₧ ₨ ₩ ₪ ₫ € ₭ ₮ ₯ ₰ ₱ ₲ ₳ ₴ ₵ ₶ ₷ ₸ ₹ ₺ ₻ ₼ ₽ ₾ ₿".split(" ")
_UNITS = ("km km² km³ m m² m³ dm dm² dm³ cm cm² cm³ mm mm² mm³ ha µm nm yd in ft kg g mg µg t lb oz m/s km/h "
          "kmh mph hPa Pa mbar mb MB kb KB gb GB tb TB T G M K %").split(" ")
_ICONS = "[\u00a6\u00a9\u00ae\u00b0\u2100-\u214f\u2190-\u21ff\u2300-\u23ff\u2500-\u27bf\u2800-\u28ff\u2b00-\u2bff\U0001f000-\U0001faff]"
_PUNCT_CLASS = "|".join(_PUNCT)  # spaCy joins with "|" and uses the result as a class, "|" included
_ELLIPSES = [r"\.\.+", "…"]

# The rule lists in spaCy's order: a prefix or infix alternation takes its first matching entry.
_PREFIXES = ["§", "%", "=", "—", "–", r"\+(?![0-9])"] + _PUNCT + _ELLIPSES + _QUOTES + _CURRENCY + [_ICONS]
_SUFFIXES = _PUNCT + _ELLIPSES + _QUOTES + [_ICONS] + ["'s", "'S", "’s", "’S", "—", "–"] + [
    r"(?<=[0-9])\+",
    r"(?<=°[FfCcKk])\.",
    r"(?<=[0-9])(?:" + "|".join(_CURRENCY) + ")",
    r"(?<=[0-9])(?:" + "|".join(_UNITS) + ")",
    rf"(?<=[0-9{_LOWER}%²\-\+{_QUOTE_CLASS}{_PUNCT_CLASS}])\.",
    rf"(?<=[{_UPPER}][{_UPPER}])\.",
]
_INFIXES = _ELLIPSES + [_ICONS] + [
    r"(?<=[0-9])[+\-\*^](?=[0-9-])",
    rf"(?<=[{_LOWER}{_QUOTE_CLASS}])\.(?=[{_UPPER}{_QUOTE_CLASS}])",
    rf"(?<=[{_ALPHA}]),(?=[{_ALPHA}])",
    rf"(?<=[{_ALPHA}0-9])(?:{_HYPHENS})(?=[{_ALPHA}])",
    rf"(?<=[{_ALPHA}0-9])[:<>=/](?=[{_ALPHA}])",
]
_prefix_re = re.compile("|".join("^" + p for p in _PREFIXES))


def _prefix_search(string: str) -> re.Match | None:
    # Only "US$", "C$" and "A$" among the prefixes start with a letter or digit: skip the big
    # alternation for the common case of a piece that starts like a word.
    first = string[0]
    if first.isalnum() and first not in "UCA":
        return None
    return _prefix_re.match(string)
_suffix_re = re.compile("|".join(p + "$" for p in _SUFFIXES))
_has_digit = re.compile(r"\d").search
_SUFFIX_WINDOW = 8  # longer than any suffix but a run of dots; lookbehinds still see before it


def _suffix_search(string: str) -> re.Match | None:
    # A suffix ending in a letter or digit is "'s" or a unit after a number; anything else ends in
    # punctuation or a symbol. Searching only the tail keeps long code pieces from being scanned
    # at every position.
    if not string:
        return None
    last = string[-1]
    if last.isalnum() and last not in "sS" and not _has_digit(string):
        return None
    if len(string) <= _SUFFIX_WINDOW or string.endswith(".."):
        return _suffix_re.search(string)
    return _suffix_re.search(string, len(string) - _SUFFIX_WINDOW)
_infix_finditer = re.compile("|".join(_INFIXES)).finditer
_url_match = re.compile(
    r"^(?:[\w+\-.]{2,}://)?(?:\S+(?::\S*)?@)?(?:(?:[1-9]\d?|1\d\d|2[01]\d|22[0-3])(?:\.(?:1?\d{1,2}|2[0-4]\d|25[0-5])){2}"
    r"(?:\.(?:[1-9]\d?|1\d\d|2[0-4]\d|25[0-4]))|(?:(?:[A-Za-z0-9\u00a1-\uffff][A-Za-z0-9\u00a1-\uffff_-]{0,62})?"
    rf"[A-Za-z0-9\u00a1-\uffff]\.)+(?:[{_LOWER}]{{2,63}}))(?::\d{{2,5}})?(?:[/?#]\S*)?$"
).match

# ----------------------------------------------------------------------------- special cases

_EMOTICONS = (
    ":) :-) :)) :-)) :))) :-))) (: (-: =) (= ]= =] [: [-: [= :] :-] :( :-( :(( :-(( :((( :-((( ): )-: =( "
    "=[ :'( :'-( :') :'-) :’( :’-( :’) :’-) :3 :-3 =3 :1 :() :* :-* :/ :-/ =/ :| :-| =| :0 :-0 :o :-o :O "
    ":-O :o) :p :-p :P :-P :D :-D =D ;D ;-D 8D 8-D :x :-x :X :-X :} :-} :> :-> >:( >:o ;) ;-) ;_; (; (-; "
    "8) 8-) (-8 <3 <33 <333 </3 ^_^ ^__^ ^___^ (^_^) -_- -__- (-_-) >.< >.> <.< (>_<) o.o o.O O.o O.O 0.0 "
    "0.o o.0 o_o o_O O_o O_O 0_0 0_o o_0 v.v V.V v_v V_V ._. (._.) @_@ (*_*) (¬_¬) ಠ_ಠ (ಠ_ಠ) ಠ︵ಠ XD XDD "
    "xD xDD (o: ><(((*> ¯\\(ツ)/¯ (╯°□°）╯︵┻━┻ C++ and/or w/o ' '' ’ ’’ \\\")"
).split(" ")
_ABBREVIATIONS = (
    "Mt. Ak. Ala. Apr. Ariz. Ark. Aug. Calif. Colo. Conn. Dec. Del. Feb. Fla. Ga. Ia. Id. Ill. Ind. Jan. "
    "Jul. Jun. Kan. Kans. Ky. La. Mar. Mass. Mich. Minn. Miss. N.C. N.D. N.H. N.J. N.M. N.Y. Neb. Nebr. Nev. "
    "Nov. Oct. Okla. Ore. Pa. S.C. Sep. Sept. Tenn. Va. Wash. Wis. 'd a.m. Adm. Bros. co. Co. Corp. D.C. Dr. "
    "e.g. E.g. E.G. Gen. Gov. i.e. I.e. I.E. Inc. Jr. Ltd. Md. Messrs. Mo. Mont. Mr. Mrs. Ms. p.m. Ph.D. "
    "Prof. Rep. Rev. Sen. St. vs. v.s. ä. ö. ü. <space> \\t \\n 'S 's ‘S ‘s 're 'Cause 'cause 'cos 'Cos "
    "'coz 'Coz 'cuz 'Cuz 'bout ma'am Ma'am o'clock O'clock lovin' Lovin' lovin Lovin havin' Havin' havin Havin"
).split(" ") + [f"{c}." for c in "abcdefghijklmnopqrstuvwxyz"]
_OTHER = ("y' all|y all|how 'd 'y|How 'd 'y|not 've|not ve|Not 've|Not ve|can not|Can not|gon na|Gon na|got ta|"
          "Got ta|let 's|Let 's|c'm on|C'm on").split("|")
# Words that the generated contractions would wrongly split ("ill" is not "i'll").
_EXCLUDE = {"Ill", "ill", "Its", "its", "Hell", "hell", "Shell", "shell", "Shed", "shed", "were", "Were",
            "Well", "well", "Whore", "whore"}


def _build_specials() -> dict[str, tuple[str, ...]]:
    """spaCy's English tokenizer exceptions, generated the way spacy/lang/en/tokenizer_exceptions.py
    generates them (only the token texts matter here)."""
    exc: dict[str, tuple[str, ...]] = {s: (s,) for s in _EMOTICONS + _ABBREVIATIONS}

    def add(*pieces: str) -> None:
        exc["".join(pieces)] = pieces

    def both(base: str, *clitics: str) -> None:  # with apostrophes, and as people type without
        add(base, *("'" + c for c in clitics))
        add(base, *clitics)

    def cased(word: str) -> tuple[str, str]:
        return word, word.title()

    for orth in cased("i"):
        both(orth, "m")
        add(orth, "'m", "a")
        add(orth, "m", "a")
    for pron in ("i", "you", "he", "she", "it", "we", "they"):
        for orth in cased(pron):
            for clitics in (("ll",), ("ll", "ve"), ("d",), ("d", "ve")):
                both(orth, *clitics)
    for pron in ("i", "you", "we", "they"):
        for orth in cased(pron):
            both(orth, "ve")
    for pron in ("you", "we", "they"):
        for orth in cased(pron):
            both(orth, "re")
    for pron in ("he", "she", "it"):
        for orth in cased(pron):
            both(orth, "s")
    for word, number in (("who", ""), ("what", ""), ("when", ""), ("where", ""), ("why", ""), ("how", ""),
                         ("there", ""), ("that", "sing"), ("this", "sing"), ("these", "plur"), ("those", "plur")):
        for orth in cased(word):
            if number != "plur":
                both(orth, "s")
            for clitics in (("ll",), ("ll", "ve")):
                both(orth, *clitics)
            if number != "sing":
                both(orth, "re")
                both(orth, "ve")
            for clitics in (("d",), ("d", "ve")):
                both(orth, *clitics)
    for verb in "ca could do does did had may might must need ought sha should wo would".split():
        for orth in cased(verb):
            add(orth, "n't")
            add(orth, "nt")
            add(orth, "n't", "'ve")
            add(orth, "nt", "ve")
    for verb in "could might must should would".split():
        for orth in cased(verb):
            both(orth, "ve")
    for verb in "ai are is was were have has dare".split():
        for orth in cased(verb):
            add(orth, "n't")
            add(orth, "nt")
    for word in "doin goin nothin nuthin ol somethin".split():
        for orth in cased(word):
            add(orth)
            add(orth + "'")
    for word in ("em", "ll", "nuff"):
        add(word)
        add("'" + word)
    for unit in "cfkCFK":
        add("°", unit, ".")
    add("—")
    for hour in range(1, 13):
        for period in ("a.m.", "am", "p.m.", "pm"):
            add(str(hour), period)
    for pieces in _OTHER:
        add(*pieces.split(" "))
    for word in _EXCLUDE:
        exc.pop(word, None)
    # Every entry with a straight apostrophe also exists with a typographic one.
    for key, pieces in list(exc.items()):
        if "'" in key:
            exc[key.replace("'", "’")] = tuple(p.replace("'", "’") for p in pieces)
    return exc


SPECIALS = _build_specials()


def _split_affixes(string: str) -> list[str]:
    """spaCy's Tokenizer._split_affixes and _attach_tokens, for one whitespace-free piece."""
    prefixes: list[str] = []
    suffixes: list[str] = []
    last_size = 0
    while string and len(string) != last_size:
        if string in SPECIALS:
            break
        last_size = len(string)
        m = _prefix_search(string)
        pre_len = m.end() - m.start() if m else 0
        if pre_len:
            prefix, minus_pre = string[:pre_len], string[pre_len:]
            if minus_pre and minus_pre in SPECIALS:
                string = minus_pre
                prefixes.append(prefix)
                break
        m = _suffix_search(string[pre_len:])
        suf_len = m.end() - m.start() if m else 0
        if suf_len:
            suffix, minus_suf = string[-suf_len:], string[:-suf_len]
            if minus_suf and minus_suf in SPECIALS:
                string = minus_suf
                suffixes.append(suffix)
                break
        if pre_len and suf_len and pre_len + suf_len <= len(string):
            string = string[pre_len:-suf_len]
            prefixes.append(prefix)
            suffixes.append(suffix)
        elif pre_len:
            string = minus_pre
            prefixes.append(prefix)
        elif suf_len:
            string = minus_suf
            suffixes.append(suffix)
    tokens = prefixes
    if string:
        if string in SPECIALS:
            tokens.extend(SPECIALS[string])
        elif _url_match(string):
            tokens.append(string)
        else:
            start = 0
            for m in _infix_finditer(string):
                if m.start() == 0:  # an infix at the very start splits nothing
                    continue
                if m.start() != start:
                    tokens.append(string[start:m.start()])
                if m.start() != m.end():
                    tokens.append(m.group())
                start = m.end()
            if string[start:]:
                tokens.append(string[start:])
    tokens.extend(reversed(suffixes))
    return tokens


def _merge_specials(tokens: list[str]) -> list[str]:
    """spaCy's special-case matcher: token runs spelling a special case are re-joined, longest
    first (a rejected overlapping run still claims its tokens, as in spaCy)."""
    n = len(tokens)
    matches = []
    for i in range(n - 1):
        for length in range(2, min(_MAX_JOIN, n - i) + 1):
            run = tuple(tokens[i:i + length])
            if _JOINABLE.get("".join(run)) == run:
                matches.append((length, i))
    if not matches:
        return tokens
    seen: set[int] = set()
    chosen = []
    for length, i in sorted(matches, key=lambda m: (-m[0], m[1])):
        if i not in seen and i + length - 1 not in seen:
            chosen.append((i, length))
        seen.update(range(i, i + length))
    out, pos = [], 0
    for i, length in sorted(chosen):
        out.extend(tokens[pos:i])
        out.extend(SPECIALS["".join(tokens[i:i + length])])
        pos = i + length
    out.extend(tokens[pos:])
    return out


def _tokens_without_specials(string: str) -> list[str]:
    saved = dict(SPECIALS)
    SPECIALS.clear()
    try:
        return _split_affixes(string)
    finally:
        SPECIALS.update(saved)


# Special cases that the affix rules would split ("):" -> ")", ":") are re-joined afterwards,
# longest first, as spaCy's special-case matcher does.
_JOINABLE = {s: tuple(t) for s in SPECIALS if len(t := _tokens_without_specials(s)) > 1}
_MAX_JOIN = max(len(t) for t in _JOINABLE.values())
class _PieceCache(dict):
    """piece -> tokens; a miss tokenises. Looked up through `map`, so a hit runs no Python code."""

    limit = 1 << 20

    def __missing__(self, piece: str) -> tuple[str, ...]:
        if (piece.isalpha() or piece.isdigit()) and piece not in SPECIALS:
            tokens: tuple[str, ...] = (piece,)  # no affix or infix rule applies to letters or digits alone
        else:
            found = _split_affixes(piece)
            tokens = tuple(_merge_specials(found) if len(found) > 1 else found)
        if len(self) >= self.limit:  # bounded memory on endless streams of unique pieces (code, URLs)
            self.clear()
        self[piece] = tokens
        return tokens


_cache = _PieceCache()


def split_words(text: str) -> list[str]:
    """The words of `text` as datatrove's `split_into_words` returns them (punctuation included)."""
    return list(chain.from_iterable(map(_cache.__getitem__, text.split())))
