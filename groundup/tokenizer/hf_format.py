"""The standard `tokenizer.json` (Hugging Face `tokenizers`) for a byte-level BPE: build and parse.

groundup keeps a tokenizer as three things: the token byte strings in id order (ids 0-255 are the
single bytes, in byte order, then one token per merge in merge order), the special tokens after
them, and the pre-tokenisation regex. `tokenizer.json` is written from those and read back into
them, so the file is the single source of truth and anything that loads it (`tokenizers`,
`transformers.PreTrainedTokenizerFast`, vLLM) tokenizes exactly like groundup's fast encoder.

Why the merges are derived here rather than copied from a trainer: the fast encoder (tiktoken)
ranks *tokens* (merge the adjacent pair whose concatenation has the lowest id), while
`tokenizers` ranks *pairs* (merge the listed pair with the lowest merge index). They agree when
every multi-byte token has exactly one merge, that merge is the split tiktoken itself reaches on
the token's bytes, and merge order equals id order. `derive_merges` builds exactly that list, and
`ignore_merges=True` makes `tokenizers` take a whole pre-token found in the vocabulary at once, as
tiktoken does.
"""

from __future__ import annotations

import functools

from groundup.errors import DataError
from groundup.io import parse_json
from groundup.tokenizer.hf_files import check_tokenizer_json

# GPT-4's split pattern (letters with an optional leading non-letter, digit groups, punctuation
# runs with trailing newlines, newline runs, whitespace), with the digit group length as a slot.
# "gpt4" is that pattern exactly. "gpt4-fast" drops the `\s+(?!\S)` alternative: the lookahead
# forces tiktoken's regex onto its backtracking engine and halves encoding speed (15 vs 26 MB/s on
# 2 cores). The only difference: a run of two or more spaces or tabs before a non-space stays
# whole ("    return" -> "    ", "return") instead of leaving its last space to the next word.
_PATTERNS = {
    "gpt4": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,DIGITS}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "gpt4-fast": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,DIGITS}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+""",
}
PATTERN_NAMES = tuple(_PATTERNS)


def split_pattern(name: str, digit_group: int) -> str:
    """The pre-tokenisation regex `name` with digit groups of 1..`digit_group` digits."""
    return _PATTERNS[name].replace("DIGITS", str(digit_group))


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character (what ByteLevel stores)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


@functools.lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_unicode().items()}


def to_unicode(token: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's merge loop on `token` alone, using only tokens ranked below `max_rank`."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def derive_merges(tokens: list[bytes]) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """Keep the tokens tiktoken can reach and return them with one merge each, in id order.

    A trained vocabulary occasionally holds a token that tiktoken's rule would never build (its
    bytes merge another way first); such a token could only make the two encoders disagree, so it
    is dropped and the later ids move down. Returns (kept tokens, merges for tokens[256:]).
    """
    kept = tokens[:256]
    ranks = {t: i for i, t in enumerate(kept)}
    merges = []
    for token in tokens[256:]:
        if token in ranks:
            continue
        parts = bpe_split(ranks, token, len(kept))
        if len(parts) != 2:
            continue
        ranks[token] = len(kept)
        kept.append(token)
        merges.append((parts[0], parts[1]))
    return kept, merges


def build_tokenizer_json(tokens: list[bytes], merges: list[tuple[bytes, bytes]], specials: list[str],
                         pattern: str, prefix: str, added: list[str] = ()) -> str:
    """Serialize with the `tokenizers` library itself, so the file is exactly its own format."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {to_unicode(t): i for i, t in enumerate(tokens)}
    pairs = [(to_unicode(a), to_unicode(b)) for a, b in merges]
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=True))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    hf.decoder = decoders.ByteLevel()
    # Added in order, they take the ids right after the vocabulary.
    hf.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    # Then `added` (the tool tags): matched whole in any text, but not special, so decoding shows them.
    hf.add_tokens([AddedToken(s, special=False, normalized=False) for s in added])
    # groundup puts the end-of-text id before every plain prompt (the context each training document
    # starts in); the post-processor adds it too, as Llama 3's adds its begin-of-text, so a transformers,
    # vLLM or llama.cpp user who tokenizes with the defaults gives the model the same context.
    template = processors.TemplateProcessing(single=f"{prefix} $A:0", pair=f"{prefix} $A:0 {prefix}:1 $B:1",
                                             special_tokens=[(prefix, len(tokens) + specials.index(prefix))])
    hf.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
    return hf.to_str(pretty=True)


def _post_processor_prefix(post: object, specials: dict[str, int], bad) -> str | None:
    """Accept what groundup writes: none or ByteLevel (files written before the prefix), or those
    followed by a TemplateProcessing that puts one special token before the text; returns its name."""
    if post is None:
        return None
    if not isinstance(post, dict):
        raise bad(f"post_processor is a {type(post).__name__}, expected an object")
    steps = post.get("processors") if post.get("type") == "Sequence" else [post]
    if not isinstance(steps, list):
        raise bad("post_processor.processors is not a list")
    prefix = None
    for step in steps:
        kind = step.get("type") if isinstance(step, dict) else None
        if kind == "ByteLevel":
            continue
        if kind != "TemplateProcessing":
            raise bad(f"post_processor {kind!r} is not one groundup writes (ByteLevel, TemplateProcessing)")
        single = step.get("single")
        parts = single if isinstance(single, list) and len(single) == 2 else [None, None]
        first, second = (p if isinstance(p, dict) else {} for p in parts)
        prefix = (first.get("SpecialToken") or {}).get("id")
        if prefix not in specials or "Sequence" not in second:
            raise bad("post_processor.single must be '<special token> $A'")
    return prefix


def parse_tokenizer_json(text: str, where: str) -> tuple[list[bytes], dict[str, int], str, str | None, dict[str, int]]:
    """Read (tokens in id order, special name -> id, split regex, the special its post-processor puts
    before a text or None, added non-special token -> id in id order) from a tokenizer.json string.

    Only the structure groundup writes is accepted (byte-level BPE, one Split regex, no
    normalizer, merges in id order), because only for that is the fast encoder provably equal.
    """
    data = parse_json(text, where)
    check_tokenizer_json(data, where)  # the shape every tokenizer.json has; below, groundup's in particular

    def bad(reason: str) -> DataError:
        return DataError(f"{where}: not a groundup byte-level BPE tokenizer.json: {reason}")

    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise bad(f"model type is {model.get('type')!r}, expected 'BPE'")
    if data.get("normalizer") is not None:
        raise bad("it has a normalizer")
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if (not isinstance(steps, list) or len(steps) != 2 or not all(isinstance(x, dict) for x in steps)
            or steps[0].get("type") != "Split" or steps[1].get("type") != "ByteLevel" or steps[1].get("use_regex")):
        raise bad("expected pre_tokenizer Sequence[Split(regex), ByteLevel(use_regex=false)]")
    pattern = steps[0].get("pattern")
    pattern = pattern.get("Regex") if isinstance(pattern, dict) else None
    if not isinstance(pattern, str) or not pattern:
        raise bad("the Split pre-tokenizer has no regex")
    table = unicode_to_byte()
    vocab = model.get("vocab") or {}
    tokens: list[bytes | None] = [None] * len(vocab)
    for piece, i in vocab.items():
        if not 0 <= i < len(vocab) or tokens[i] is not None:
            raise bad(f"vocabulary ids are not 0..{len(vocab) - 1} (id {i})")
        try:
            tokens[i] = bytes(table[c] for c in piece)
        except KeyError:
            raise bad(f"token {piece!r} is not byte-level") from None
    if tokens[:256] != [bytes([b]) for b in range(256)]:
        raise bad("ids 0-255 must be the 256 single bytes in byte order")
    merges = model.get("merges") or []
    if len(merges) != len(tokens) - 256:
        raise bad(f"{len(merges)} merges for {len(tokens) - 256} multi-byte tokens")
    for k, merge in enumerate(merges):
        a, b = merge.split(" ") if isinstance(merge, str) else merge
        if vocab.get(a + b) != 256 + k:
            raise bad(f"merge {k} ({a!r}, {b!r}) does not build token {256 + k}; merges must be in id order")
    specials, plain = {}, {}
    for added in data.get("added_tokens") or []:
        (specials if added.get("special") is True else plain)[added["content"]] = added["id"]
    if sorted(specials.values()) != list(range(len(tokens), len(tokens) + len(specials))):
        raise bad("special tokens must take the ids right after the vocabulary")
    first = len(tokens) + len(specials)
    if sorted(plain.values()) != list(range(first, first + len(plain))):
        raise bad("added tokens that are not special must take the ids right after the special tokens")
    prefix = _post_processor_prefix(data.get("post_processor"), specials, bad)
    return tokens, specials, pattern, prefix, dict(sorted(plain.items(), key=lambda kv: kv[1]))

