"""Reading a Hugging Face tokenizer directory safely: every malformed file is a DataError naming it.

    files = read_hf_tokenizer_dir(Path("some/model"))      # tokenizer.json + the files beside it
    files.tokenizer_json, files.config, files.special_tokens_map, files.generation_eos, files.chat_template

`tokenizer.json` is checked for the shape the `tokenizers` library expects (objects where objects
belong, vocabulary ids in range and unique, merges that name vocabulary tokens, added tokens with an
id and a content) before the library sees it, so a damaged or hand-edited file gives a message with
the file, the key and the reason instead of a Rust panic or a Python traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groundup.errors import DataError
from groundup.io import parse_json, read_json, read_text
from groundup.layout import (HF_CHAT_TEMPLATE_FILE as CHAT_TEMPLATE_FILE, HF_GENERATION_CONFIG_FILE,
                             HF_SPECIAL_TOKENS_FILE, HF_TOKENIZER_CONFIG_FILE, TOKENIZER_FILE)

MODEL_TYPES = ("BPE", "Unigram", "WordPiece", "WordLevel")
# Ids may leave holes (a vocabulary that lists a spelling twice keeps the last id, as llama.cpp and
# transformers do), but not run past this: a wild id would size every per-id table after it.
MAX_ID = 1 << 24


def read_json_object(path: Path) -> dict:
    return read_json(path, expect=dict)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_tokenizer_json(data: Any, where: str | Path) -> None:
    """Raise DataError naming the key and the reason unless `data` has tokenizer.json's shape."""
    def bad(key: str, reason: str) -> DataError:
        return DataError(f"{where}: {key}: {reason}")

    if not isinstance(data, dict):
        raise DataError(f"{where}: expected a JSON object, got {_kind(data)}")
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation", "padding"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise bad(key, f"expected an object or null, got {_kind(data[key])}")
    model = data.get("model")
    if not isinstance(model, dict):
        raise bad("model", f"expected an object, got {_kind(model)}")
    kind = model.get("type", "BPE" if "merges" in model else None)
    if kind not in MODEL_TYPES:
        raise bad("model.type", f"{kind!r} is not one of {', '.join(MODEL_TYPES)}")
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise bad("added_tokens", f"expected a list, got {_kind(added)}")
    vocab = model.get("vocab")
    if kind == "Unigram":
        if not isinstance(vocab, list):
            raise bad("model.vocab", f"expected a list of [piece, score], got {_kind(vocab)}")
        for i, entry in enumerate(vocab):
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                    and isinstance(entry[1], (int, float)) and not isinstance(entry[1], bool)):
                raise bad(f"model.vocab[{i}]", "expected [piece, score]")
    else:
        if not isinstance(vocab, dict):
            raise bad("model.vocab", f"expected an object of token -> id, got {_kind(vocab)}")
        seen: dict[int, str] = {}
        for piece, i in vocab.items():
            if not _is_id(i) or not 0 <= i < MAX_ID:
                raise bad("model.vocab", f"token {piece!r} has id {i!r}, outside 0..{MAX_ID - 1}")
            if i in seen:
                raise bad("model.vocab", f"tokens {seen[i]!r} and {piece!r} share id {i}")
            seen[i] = piece
    if kind == "BPE":
        _check_merges(model.get("merges"), vocab, bad)
    for k, token in enumerate(added):
        if not isinstance(token, dict) or not _is_id(token.get("id")) or not isinstance(token.get("content"), str):
            raise bad(f"added_tokens[{k}]", "expected an object with an integer id and a string content")
        if not 0 <= token["id"] < MAX_ID:
            raise bad(f"added_tokens[{k}]", f"id {token['id']} is outside 0..{MAX_ID - 1}")


def _check_merges(merges: Any, vocab: dict, bad) -> None:
    if merges is None:
        return
    if not isinstance(merges, list):
        raise bad("model.merges", f"expected a list, got {_kind(merges)}")
    for k, merge in enumerate(merges):
        if isinstance(merge, str):
            pair = merge.split(" ")
        else:
            pair = merge if isinstance(merge, list) and all(isinstance(p, str) for p in merge) else None
        if pair is None or len(pair) != 2:
            raise bad(f"model.merges[{k}]", f"expected 'a b' or [a, b], got {merge!r}")
        missing = [p for p in (*pair, pair[0] + pair[1]) if p not in vocab]
        if missing:
            raise bad(f"model.merges[{k}]", f"{missing[0]!r} is not in the vocabulary")


@dataclass
class HFTokenizerFiles:
    """What a Hugging Face tokenizer directory says, checked; `where` names tokenizer.json."""

    tokenizer_json: str
    where: str
    config: dict = field(default_factory=dict)  # tokenizer_config.json
    special_tokens_map: dict | None = None  # special_tokens_map.json, when present
    generation_eos: list[int] = field(default_factory=list)  # generation_config.json's eos ids
    chat_template: str | None = None


def read_hf_tokenizer_dir(path: Path) -> HFTokenizerFiles:
    """The files of a tokenizer directory (or of the directory holding `path`, a tokenizer.json)."""
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"{file}: tokenizer not found (expected a directory holding {TOKENIZER_FILE})")
    text = read_text(file)
    check_tokenizer_json(parse_json(text, file), file)
    directory = file.parent
    files = HFTokenizerFiles(text, str(file))
    if (directory / HF_TOKENIZER_CONFIG_FILE).is_file():
        files.config = read_json_object(directory / HF_TOKENIZER_CONFIG_FILE)
    if (directory / HF_SPECIAL_TOKENS_FILE).is_file():
        files.special_tokens_map = read_json_object(directory / HF_SPECIAL_TOKENS_FILE)
    if (directory / HF_GENERATION_CONFIG_FILE).is_file():
        gen_file = directory / HF_GENERATION_CONFIG_FILE
        eos = read_json_object(gen_file).get("eos_token_id")
        eos = [eos] if _is_id(eos) else eos if eos is not None else []
        if not isinstance(eos, list) or not all(_is_id(i) for i in eos):
            raise DataError(f"{gen_file}: eos_token_id: expected an id or a list of ids, got {eos!r}")
        files.generation_eos = eos
    files.chat_template = _chat_template(files.config, directory)
    return files


def _chat_template(config: dict, directory: Path) -> str | None:
    where = directory / HF_TOKENIZER_CONFIG_FILE
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise DataError(f"{where}: chat_template: expected a string or a list of named templates")
    if template is None and (directory / CHAT_TEMPLATE_FILE).is_file():
        template = read_text(directory / CHAT_TEMPLATE_FILE)
    return template
