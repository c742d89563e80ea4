"""The tokenizer stored in a GGUF file's metadata, rebuilt as a Hugging Face tokenizer directory.

    files = tokenizer_from_gguf(metadata, where)     # -> HFTokenizerFiles (tokenizer.json text, config, ...)

llama.cpp keeps the vocabulary as metadata: `tokenizer.ggml.model` names the kind, "gpt2" for
byte-level BPE (tokens, merges, token types, and `tokenizer.ggml.pre` naming the pre-tokenizer
regex) or "llama" for SentencePiece (tokens, scores, token types; no merges). Both become a
`tokenizers` BPE written with the `tokenizers` library itself (transformers is not needed):

- byte-level: the split regex `tokenizer.ggml.pre` names (the table follows llama.cpp's and
  transformers' GGUF loader; SmolLM splits digits singly as its own tokenizer.json does, Qwen2 keeps
  its NFC normalizer, Llama 3 takes a whole word found in the vocabulary as one token
  (ignore_merges), as llama.cpp and Meta's tokenizer.json do). An unknown name is refused: a wrong
  regex tokenizes plausibly and wrongly.
- SentencePiece: BPE with byte fallback (`<0x41>`) and the `▁` metaspace, merges derived from the
  scores exactly as transformers' GGUF converter does (`generate_merges`).

Tokens typed control (3) and unknown (2) become special tokens, user-defined ones (4) added tokens
matched whole; the special ids, `add_bos_token` (default on for SentencePiece, as llama.cpp does),
`add_eos_token` and `tokenizer.chat_template` go to tokenizer_config.json, and eos / eot / eom ids to
generation_config.json's stop list.
"""

from __future__ import annotations

from typing import Any

from groundup.errors import DataError
from groundup.tokenizer.hf_files import HFTokenizerFiles
from groundup.tokenizer.hf_format import byte_to_unicode

CONTROL, UNKNOWN, USER_DEFINED = 3, 2, 4

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = "gpt2"  # GPT-2's own regex, inside the ByteLevel pre-tokenizer
SMOLLM = "smollm"  # single digits, then GPT-2's regex
# tokenizer.ggml.pre -> (split regex or one of the two above, ignore_merges, NFC normalizer)
PRE_TOKENIZERS: dict[str, tuple[str, bool, bool]] = {
    **{name: (_LLAMA3, True, False) for name in ("llama3", "llama-v3", "llama-bpe")},
    **{name: (_LLAMA3, False, False) for name in ("falcon3", "falcon-h1", "pixtral", "smaug-bpe", "dbrx", "lfm2")},
    **{name: (_QWEN2, False, True) for name in ("qwen2", "deepseek-r1-qwen", "megrez")},
    **{name: (_GPT4O, False, False) for name in ("gpt-4o", "llama4")},
    "tekken": (_TEKKEN, False, False),
    "smollm": (SMOLLM, False, False),
    "gpt2": (GPT2, False, False),
    "default": (GPT2, False, False),  # what transformers' GGUF loader does for it
}


def merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """SentencePiece merges recovered from token scores: transformers' `generate_merges`, step for step
    (every split of a token into two vocabulary tokens, best score first), so the ids agree with it."""
    merges = []
    for piece, score in scores.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _added(tokens: list[str], types: list[int]):
    from tokenizers import AddedToken

    specials = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k in (CONTROL, UNKNOWN)]
    plain = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED]
    return specials, plain


def _byte_level(meta: dict, tokens: list[str], where: str):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise DataError(f"{where}: tokenizer.ggml.pre = {pre!r} is not a pre-tokenizer groundup knows (known: "
                        f"{', '.join(sorted(PRE_TOKENIZERS))})")
    split, ignore_merges, nfc = PRE_TOKENIZERS[pre]
    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(m, str) and m.count(" ") == 1 for m in merges):
        raise DataError(f"{where}: tokenizer.ggml.merges: expected a list of 'a b' strings for a gpt2 tokenizer")
    alphabet = set(byte_to_unicode().values())
    spell = byte_to_unicode()
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    # A normal token is stored byte-level spelled; one that is not is re-spelled (as transformers does).
    vocab = {(t if k != 1 or set(t) <= alphabet else "".join(spell[b] for b in t.encode())): i
             for i, (t, k) in enumerate(zip(tokens, types))}
    pairs = [tuple(m.split(" ")) for m in merges]
    missing = next((p for p in pairs if p[0] not in vocab or p[1] not in vocab or p[0] + p[1] not in vocab), None)
    if missing:
        raise DataError(f"{where}: tokenizer.ggml.merges: merge {' '.join(missing)!r} names a token not in the "
                        "vocabulary")
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges, fuse_unk=False))
    if nfc:
        tk.normalizer = normalizers.NFC()
    if split == GPT2:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif split == SMOLLM:
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    return tk, types, [processors.ByteLevel(trim_offsets=False)]


def _sentencepiece(meta: dict, tokens: list[str], where: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise DataError(f"{where}: tokenizer.ggml.scores: expected one score per token for a llama tokenizer")
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges_from_scores(vocab, dict(zip(tokens, scores))),
                              fuse_unk=True, byte_fallback=True, unk_token=tokens[unk] if unk is not None else None))
    prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", split=False,
                                                prepend_scheme="first" if prefix_space else "never")
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tk.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix_space else []))
    return tk, meta.get("tokenizer.ggml.token_type") or [1] * len(tokens), []


def tokenizer_from_gguf(meta: dict[str, Any], where: str) -> HFTokenizerFiles:
    """The tokenizer files a GGUF file's metadata describes; DataError naming the key when it cannot."""
    from tokenizers import processors

    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise DataError(f"{where}: tokenizer.ggml.tokens: missing or not a list of strings")
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and (not isinstance(types, list) or len(types) != len(tokens)):
        raise DataError(f"{where}: tokenizer.ggml.token_type: expected one type per token")

    def token_of(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        if i is None:
            return None
        if not isinstance(i, int) or not 0 <= i < len(tokens):
            raise DataError(f"{where}: tokenizer.ggml.{key} = {i!r} is not a token id (0..{len(tokens) - 1})")
        return tokens[i]

    named = {"bos_token": token_of("bos_token_id"), "eos_token": token_of("eos_token_id"),
             "unk_token": token_of("unknown_token_id"), "pad_token": token_of("padding_token_id")}
    if kind == "gpt2":
        tk, types, post = _byte_level(meta, tokens, where)
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    elif kind == "llama":
        tk, types, post = _sentencepiece(meta, tokens, where)
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))  # llama.cpp's default for SentencePiece
    else:
        raise DataError(f"{where}: tokenizer.ggml.model = {kind!r}: groundup reads 'gpt2' (byte-level BPE) and "
                        "'llama' (SentencePiece) tokenizers")
    specials, plain = _added(tokens, types)
    tk.add_special_tokens(specials)
    tk.add_tokens(plain)
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    bos = named["bos_token"] if add_bos else None
    eos = named["eos_token"] if add_eos else None
    single = [f"{bos}:0"] * bool(bos) + ["$A:0"] + [f"{eos}:0"] * bool(eos)
    pair = single + [f"{bos}:1"] * bool(bos) + ["$B:1"] + [f"{eos}:1"] * bool(eos)
    template = processors.TemplateProcessing(single=single, pair=pair,
                                             special_tokens=[(t, tk.token_to_id(t)) for t in {bos, eos} if t])
    tk.post_processor = processors.Sequence([*post, template])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **{k: v for k, v in named.items() if v is not None},
              "add_bos_token": bos is not None, "add_eos_token": eos is not None, "clean_up_tokenization_spaces": False}
    template_text = meta.get("tokenizer.chat_template")
    if isinstance(template_text, str):
        config["chat_template"] = template_text
    stops = [meta.get(f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id", "eom_token_id")]
    eos = sorted({i for i in stops if isinstance(i, int) and 0 <= i < len(tokens)})
    return HFTokenizerFiles(tk.to_str(pretty=True), where, config=config, generation_eos=eos,
                            chat_template=config.get("chat_template"))
