"""`Tokenizer`: groundup's byte-level BPE, stored as a standard `tokenizer.json`, encoded by tiktoken.

    tok = Tokenizer.load("out/tokenizer")          # a directory or its tokenizer.json
    ids = tok.encode("To be, or not to be")        # never yields special ids
    text = tok.decode(ids)
    ids, mask = tok.render_chat([{"role": "user", "content": "2+2?"},
                                 {"role": "assistant", "content": "4"}])
    tok.bos_id, tok.eos_id, tok.pad_id, tok.end_of_turn_id, tok.vocab_size, tok.hash

Ids: 0-255 are the single bytes (id == byte value), then one id per merge in merge order, then the
special tokens (`SPECIAL_TOKENS` order): begin/end of text, pad, system, user, assistant, end of
turn, then the four tool tags (`TOOL_TOKENS`: <tool_call>, </tool_call>, <tool_response>,
</tool_response>; a tokenizer saved before them has none and writes the tags as text). The tool tags
are not special (tool_tokens.py): decoding shows them with skip_special_tokens, `token_bytes` counts
their spelling, and, like the specials, `encode` never yields them. Every byte string round-trips
(`decode_bytes(encode_bytes(b)) == b`); `encode` takes a str, and lone surrogates (which no UTF-8
text can hold) are encoded as U+FFFD.

Encoding uses tiktoken built from the same ranks and split regex, over 10x faster than
`tokenizers` here and token-identical to the saved `tokenizer.json` (see `hf_format`; the tests
check the whole embedded corpus). `hash` identifies the tokenization (tokens, specials, regex):
token shards record it and training refuses shards made by another tokenizer.

A tokenizer directory holds `tokenizer.json` and `groundup_tokenizer.json` (special-token roles,
the chat template as Jinja, the hash, and how it was trained). This is the "groundup" backend of the
interface in `base.py`; `prefix_ids` is [eot_id]: every training document starts in the context of
the end-of-text that closed the one before, so a prompt does too (and `tokenizer.json`'s
post-processor adds it, so transformers, vLLM and llama.cpp see the same context).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from groundup.errors import DataError
from groundup.io import atomic_write_json, atomic_write_text, read_text
from groundup.layout import TOKENIZER_FILE, TOKENIZER_META_FILE as META_FILE
from groundup.tokenizer import chat
from groundup.tokenizer.base import BaseTokenizer, check_texts, replace_surrogates
from groundup.tokenizer.chat import SPECIAL_TOKENS, TOOL_TOKENS
from groundup.tokenizer.hf_files import read_json_object
from groundup.tokenizer.hf_format import build_tokenizer_json, derive_merges, parse_tokenizer_json

_INVALID_BYTE = re.compile("[\udc80-\udcff]+")  # what surrogateescape makes of invalid UTF-8


class Tokenizer(BaseTokenizer):
    backend = "groundup"

    def __init__(self, tokens: Sequence[bytes], pattern: str, special_names: dict[str, str] = SPECIAL_TOKENS,
                 meta: dict | None = None, tool_names: dict[str, str] = TOOL_TOKENS):
        """`tokens` in id order (ids 0-255 the single bytes); specials follow in `special_names` order, then
        the tool tags in `tool_names` order (empty: a tokenizer saved before them)."""
        import tiktoken

        self.tokens = list(tokens)
        if self.tokens[:256] != [bytes([b]) for b in range(256)]:
            raise ValueError("tokenizer: ids 0-255 must be the 256 single bytes in byte order")
        self.pattern = pattern
        self.special_names = dict(special_names)
        self.specials = {name: len(self.tokens) + i for i, name in enumerate(self.special_names.values())}
        self.tool_names = dict(tool_names)
        first_tool = len(self.tokens) + len(self.specials)
        self.tool_ids = {name: first_tool + i for i, name in enumerate(self.tool_names.values())}  # spelling -> id
        self.meta = dict(meta or {})
        ranks = {t: i for i, t in enumerate(self.tokens)}
        if len(ranks) != len(self.tokens):
            raise DataError("tokenizer: the vocabulary holds a token twice")
        # tiktoken's "special" tokens are those plain encoding never yields: the specials and the tool tags.
        self._enc = tiktoken.Encoding("groundup", pat_str=pattern, mergeable_ranks=ranks,
                                      special_tokens={**self.specials, **self.tool_ids})
        ids = {role: self.specials[name] for role, name in self.special_names.items()}
        self.bos_id, self.pad_id = ids["bos"], ids["pad"]
        self.eot_id = ids["eot"]  # end of text: separates documents in token shards (eos_id is its alias)
        self.system_id, self.user_id, self.assistant_id = ids["system"], ids["user"], ids["assistant"]
        self.end_of_turn_id = ids["end_of_turn"]
        self.special_ids = ids  # role -> id, e.g. {"bos": 8185, ...}

    # ------------------------------------------------------------------ building and files

    @classmethod
    def from_trained(cls, tokens: Sequence[bytes], pattern: str, meta: dict | None = None) -> "Tokenizer":
        """From a trainer's tokens (single bytes first): drops those tiktoken could never build."""
        kept, _ = derive_merges(list(tokens))
        return cls(kept, pattern, SPECIAL_TOKENS, meta)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Load a tokenizer directory, or a `tokenizer.json` (its directory's metadata is used if present)."""
        path = Path(path)
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise DataError(f"{file}: tokenizer not found (expected a directory holding {TOKENIZER_FILE}, "
                            "made by 'groundup tokenizer train')")
        meta_path = file.parent / META_FILE
        meta = read_json_object(meta_path) if meta_path.is_file() else {}
        tokens, specials, pattern, prefix, added = parse_tokenizer_json(read_text(file), str(file))
        names = meta.get("special_tokens") or SPECIAL_TOKENS
        if (not isinstance(names, dict) or set(names) != set(SPECIAL_TOKENS)
                or not all(isinstance(n, str) for n in names.values())):
            raise DataError(f"{meta_path}: special_tokens: expected an object with the roles {list(SPECIAL_TOKENS)}")
        missing = [n for n in names.values() if n not in specials]
        if missing or len(specials) != len(names):
            raise DataError(f"{file}: special tokens {sorted(specials)} do not match the expected "
                            f"{list(names.values())}")
        if [specials[n] for n in names.values()] != sorted(specials.values()):
            raise DataError(f"{file}: special tokens are not in the expected order {list(names.values())}")
        if prefix is not None and prefix != names["eot"]:
            raise DataError(f"{file}: its post-processor puts {prefix} before a text; groundup's puts {names['eot']}")
        tools = meta.get("tool_tokens") or TOOL_TOKENS
        if not isinstance(tools, dict) or not all(isinstance(n, str) for n in tools.values()):
            raise DataError(f"{meta_path}: tool_tokens: expected an object of role -> spelling")
        if added and list(added) != list(tools.values()):
            raise DataError(f"{file}: its added tokens {list(added)} are not the tool tags {list(tools.values())}")
        tok = cls(tokens, pattern, names, meta, tools if added else {})  # none: saved before the tool tags
        if meta.get("hash") and meta["hash"] != tok.hash:
            raise DataError(f"{file}: tokenizer hash {tok.hash} differs from {meta['hash']} recorded in "
                            f"{meta_path.name}: the file was changed after it was written")
        return tok

    def to_json(self) -> str:
        """The standard `tokenizer.json` text."""
        _, merges = derive_merges(self.tokens)
        return build_tokenizer_json(self.tokens, merges, list(self.special_names.values()), self.pattern,
                                    prefix=self.special_names["eot"], added=list(self.tool_names.values()))

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `tokenizer.json` and `groundup_tokenizer.json` into `directory` (each atomically)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / TOKENIZER_FILE, self.to_json())
        meta = {**self.meta, "format": "groundup-tokenizer", "version": 1, "hash": self.hash,
                "vocab_size": self.vocab_size, "special_tokens": self.special_names,
                "special_ids": self.special_ids, "tool_tokens": self.tool_names, "pattern": self.pattern,
                "chat_template": self.chat_template}
        atomic_write_json(directory / META_FILE, meta)  # written last: its hash vouches for the file
        return directory

    # ------------------------------------------------------------------ identity

    @property
    def vocab_size(self) -> int:
        return len(self.tokens) + len(self.specials) + len(self.tool_ids)

    @property
    def hash(self) -> str:
        """16 hex digits of sha256 over the tokens, the specials, the tool tags and the split regex (a
        tokenizer without tool tags hashes as it did before they existed)."""
        if not hasattr(self, "_hash"):
            parts = {"pattern": self.pattern, "tokens": [t.hex() for t in self.tokens], "specials": self.specials}
            if self.tool_ids:
                parts["tools"] = self.tool_ids
            canon = json.dumps(parts, sort_keys=True)
            self._hash = hashlib.sha256(canon.encode()).hexdigest()[:16]
        return self._hash

    @property
    def chat_template(self) -> str:
        return chat.chat_template(self.special_names)

    @property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset(self.specials.values())

    def added_token_id(self, spelling: str) -> int | None:
        """The id of a special token or tool tag spelled `spelling` (None: not one)."""
        return self.specials.get(spelling, self.tool_ids.get(spelling))

    def is_special(self, token_id: int) -> bool:
        return len(self.tokens) <= token_id < len(self.tokens) + len(self.specials)  # they follow the vocabulary

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset((self.eot_id, self.end_of_turn_id))

    @property
    def prefix_ids(self) -> list[int]:
        return [self.eot_id]

    def __reduce__(self):  # rebuilt from its parts in a worker process (spawn pickles it)
        return (Tokenizer, (self.tokens, self.pattern, self.special_names, self.meta, self.tool_names))

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, hash={self.hash})"

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text; special-token spellings in `text` are encoded as ordinary text."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Iterable[str], num_threads: int | None = None) -> list[list[int]]:
        """`encode` over many texts on `num_threads` threads (default: all cores)."""
        texts = check_texts(texts)
        return self._enc.encode_ordinary_batch(texts, num_threads=num_threads or os.cpu_count() or 1)

    def encode_to_numpy(self, text: str) -> np.ndarray:
        """`encode` as a uint32 array, without building a Python list (the shard writer's path)."""
        try:
            return self._enc.encode_to_numpy(text, disallowed_special=())
        except UnicodeEncodeError:  # lone surrogates: encode as U+FFFD, as `encode` does
            return self._enc.encode_to_numpy(replace_surrogates(text), disallowed_special=())

    def encode_bytes(self, data: bytes) -> list[int]:
        """Token ids of arbitrary bytes: valid UTF-8 runs as text, other bytes as their byte tokens."""
        text = bytes(data).decode("utf-8", errors="surrogateescape")
        ids: list[int] = []
        pos = 0
        for m in _INVALID_BYTE.finditer(text):
            ids.extend(self._enc.encode_ordinary(text[pos : m.start()]))
            ids.extend(ord(c) - 0xDC00 for c in m.group())  # U+DC80+b stands for byte b >= 128
            pos = m.end()
        ids.extend(self._enc.encode_ordinary(text[pos:]))
        return ids

    # ------------------------------------------------------------------ decoding

    def decode_bytes(self, ids: Any, skip_special_tokens: bool = False) -> bytes:
        ids = self.check_ids(ids)
        if skip_special_tokens:  # the tool tags are not special: they stay, as Hugging Face's added tokens do
            ids = [i for i in ids if not self.is_special(i)]
        return self._enc.decode_bytes(ids)

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 (a cut multi-byte character) become U+FFFD."""
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes per id (0 for special tokens, a tool tag its spelling): the denominator of bits-per-byte."""
        lengths = np.zeros(self.vocab_size, dtype=np.int32)
        lengths[: len(self.tokens)] = [len(t) for t in self.tokens]
        for name, i in self.tool_ids.items():
            lengths[i] = len(name.encode())
        return lengths

    def id_to_bytes(self, token_id: int) -> bytes:
        """The bytes of one token; a special token's or tool tag's are its spelling (b"<|user|>", b"<tool_call>")."""
        return self.decode_bytes([token_id])

    # ------------------------------------------------------------------ chat

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False,
                    tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
        """(ids, loss mask) of a conversation; the mask is 1 on assistant content and its end of turn."""
        return chat.render_chat(self, messages, add_generation_prompt, tools)

    def render_continuation(self, messages: Sequence[dict], new_messages: Sequence[dict],
                            add_generation_prompt: bool = True, tools: list[dict] | None = None) -> list[int]:
        """The ids rendering `new_messages` after `messages` adds (chat.render_continuation: exact)."""
        return chat.render_continuation(self, messages, new_messages, add_generation_prompt, tools)
