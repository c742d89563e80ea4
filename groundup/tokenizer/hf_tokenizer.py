"""`HFTokenizer`: any Hugging Face `tokenizer.json` behind groundup's tokenizer interface (see base.py).

    tok = HFTokenizer.load("path/to/llama-or-qwen")     # tokenizer.json (+ tokenizer_config.json, ...)
    tok.encode("KING HENRY."), tok.prefix_ids, tok.render_chat(messages, add_generation_prompt=True)

Encoding is the `tokenizers` library itself, so ids are exactly what transformers gives with
`add_special_tokens=False`, except that a special token spelled inside a document stays text (as
`split_special_tokens=True` does): only `render_chat` turns the template's own special-token
spellings into specials, as `apply_chat_template` does. Byte-level BPE (GPT-2, Llama 3, Qwen,
SmolLM), SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Gemma) and Unigram all work;
`id_to_bytes` knows their spellings (byte-level characters, `<0x41>`, the `▁` space).

Roles come from tokenizer_config.json (falling back to special_tokens_map.json): eot is the eos
token (the document separator of token shards); end_of_turn is the first special token the chat
template writes after an assistant's content; stop_ids adds generation_config.json's eos ids.
`prefix_ids` is what the post-processor puts before a single text (Llama's bos, nothing for Qwen),
or, when tokenizer_config.json sets add_bos_token/add_eos_token, what transformers then rebuilds.
`hash` is sha256 over the canonical tokenizer.json and the role tokens.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from groundup.errors import DataError
from groundup.io import atomic_write_json, atomic_write_text, parse_json
from groundup.layout import (HF_GENERATION_CONFIG_FILE, HF_SPECIAL_TOKENS_FILE, HF_TOKENIZER_CONFIG_FILE,
                             TOKENIZER_FILE)
from groundup.tokenizer.base import BaseTokenizer, check_texts, replace_surrogates
from groundup.tokenizer.chat_template import continuation_text, render_chat_ids, render_template
from groundup.tokenizer.hf_files import HFTokenizerFiles, read_hf_tokenizer_dir
from groundup.tokenizer.hf_format import unicode_to_byte

# transformers' named special tokens: the template sees each as a variable (bos_token, ...).
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# With no tokenizer_config.json to name the eos token, these spellings are taken as end of text.
EOT_SPELLINGS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Ok"}]


def _walk(node: Any) -> Iterable[dict]:
    """Every object inside a tokenizer.json component (Sequences nest)."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


class HFTokenizer(BaseTokenizer):
    backend = "huggingface"

    def __init__(self, files: HFTokenizerFiles):
        from tokenizers import Tokenizer as RustTokenizer

        self.files, self.meta = files, {}
        try:
            self._plain = RustTokenizer.from_str(files.tokenizer_json)
            self._chat = RustTokenizer.from_str(files.tokenizer_json)
        except Exception as e:  # noqa: BLE001 - the library raises a bare Exception with its reason
            raise DataError(f"{files.where}: the tokenizers library cannot load it: {e}") from None
        for tk in (self._plain, self._chat):
            tk.no_truncation()
            tk.no_padding()
        self._plain.encode_special_tokens = True  # a document that spells <|im_end|> cannot forge one
        data = parse_json(files.tokenizer_json, files.where)
        vocab = self._chat.get_vocab(with_added_tokens=True)
        self._vocab_size = max(vocab.values(), default=-1) + 1
        added = self._chat.get_added_tokens_decoder()
        self._special = frozenset(i for i, t in added.items() if t.special)
        self._added = {i: t.content for i, t in added.items()}
        self._byte_level = any(n.get("type") == "ByteLevel" for key in ("pre_tokenizer", "decoder")
                               for n in _walk(data.get(key)))
        self._byte_fallback = bool(data["model"].get("byte_fallback"))
        self.token_strings = self._named_tokens()
        ids = {role: self._id_of(key) for role, key in (("bos", "bos_token"), ("eot", "eos_token"),
                                                          ("pad", "pad_token"), ("unk", "unk_token"))}
        if ids["eot"] is None:
            found = [s for s in EOT_SPELLINGS if self._chat.token_to_id(s) in self._special]
            ids["eot"] = self._chat.token_to_id(found[0]) if found else None
            if found:
                self.token_strings.setdefault("eos_token", found[0])
        self.bos_id, self.eot_id, self.pad_id, self.unk_id = ids["bos"], ids["eot"], ids["pad"], ids["unk"]
        self._prefix = self._find_prefix()

    # ------------------------------------------------------------------ building and files

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HFTokenizer":
        """A directory holding tokenizer.json (and tokenizer_config.json, ...), or the tokenizer.json itself."""
        return cls(read_hf_tokenizer_dir(Path(path)))

    def __reduce__(self):  # rebuilt from its files in a worker process (spawn pickles it)
        return (HFTokenizer, (self.files,))

    def save(self, directory: str | os.PathLike) -> Path:
        """tokenizer.json as read, tokenizer_config.json (with the chat template inside),
        special_tokens_map.json when there was one, and generation_config.json's eos ids."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / TOKENIZER_FILE, self.files.tokenizer_json)
        config = dict(self.files.config)
        if self.files.chat_template is not None and not isinstance(config.get("chat_template"), (str, list)):
            config["chat_template"] = self.files.chat_template
        atomic_write_json(directory / HF_TOKENIZER_CONFIG_FILE, config)
        if self.files.special_tokens_map is not None:
            atomic_write_json(directory / HF_SPECIAL_TOKENS_FILE, self.files.special_tokens_map)
        if self.files.generation_eos:
            atomic_write_json(directory / HF_GENERATION_CONFIG_FILE, {"eos_token_id": self.files.generation_eos})
        return directory

    def _named_tokens(self) -> dict[str, str]:
        """bos_token, eos_token, ... -> spelling, from tokenizer_config.json, else special_tokens_map.json."""
        out = {}
        for source in (self.files.special_tokens_map or {}, self.files.config):
            for key in NAMED_TOKENS:
                value = source.get(key)
                if isinstance(value, dict):  # a serialized AddedToken
                    value = value.get("content")
                if isinstance(value, str):
                    out[key] = value
                elif value is not None:
                    raise DataError(f"{self.files.where}: {key}: expected a token string, got {value!r}")
        return out

    def _id_of(self, key: str) -> int | None:
        name = self.token_strings.get(key)
        if name is None:
            return None
        token_id = self._chat.token_to_id(name)
        if token_id is None:
            raise DataError(f"{Path(self.files.where).parent / HF_TOKENIZER_CONFIG_FILE}: {key} {name!r} is not in "
                            f"the vocabulary of {self.files.where}")
        return token_id

    def _find_prefix(self) -> list[int]:
        config = self.files.config
        if "add_bos_token" in config or "add_eos_token" in config:  # transformers rebuilds the post-processor
            return [self.bos_id] if config.get("add_bos_token") and self.bos_id is not None else []
        encoding = self._chat.encode("a", add_special_tokens=True)
        prefix = []
        for token_id, special in zip(encoding.ids, encoding.special_tokens_mask):
            if not special:
                break
            prefix.append(token_id)
        return prefix

    # ------------------------------------------------------------------ identity

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def hash(self) -> str:
        """16 hex digits of sha256 over the canonical tokenizer.json and the role tokens."""
        if not hasattr(self, "_hash"):
            canon = json.dumps({"tokenizer": parse_json(self.files.tokenizer_json, self.files.where),
                                "specials": self.token_strings}, sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False)
            self._hash = hashlib.sha256(canon.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return self._hash

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special

    def added_token_id(self, spelling: str) -> int | None:
        """The id of the added token (special or not, e.g. Qwen2.5's <tool_call>) spelled `spelling`, else None."""
        token_id = self._chat.token_to_id(spelling)
        return token_id if token_id in self._added else None

    @property
    def chat_template(self) -> str | None:
        return self.files.chat_template

    @functools.cached_property
    def end_of_turn_id(self) -> int | None:
        """The first special token the template writes after an assistant's content (eos if none)."""
        if self.chat_template is None:
            return None
        try:
            text = render_template(self.chat_template, _PROBE, False, self.token_strings)
        except DataError:
            return self.eot_id
        end = text.rfind("Ok") + 2
        encoding = self._chat.encode(text, add_special_tokens=False)
        for token_id, (start, _) in zip(encoding.ids, encoding.offsets):
            if start >= end and token_id in self._special:
                return token_id
        return self.eot_id

    @property
    def special_ids(self) -> dict[str, int]:
        ids = {"bos": self.bos_id, "eot": self.eot_id, "pad": self.pad_id, "unk": self.unk_id,
               "end_of_turn": self.end_of_turn_id}
        return {role: i for role, i in ids.items() if i is not None}

    @property
    def stop_ids(self) -> frozenset[int]:
        ids = (self.eot_id, self.end_of_turn_id, *self.files.generation_eos)
        return frozenset(i for i in ids if i is not None)

    @property
    def prefix_ids(self) -> list[int]:
        return list(self._prefix)

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, hash={self.hash}, file={self.files.where!r})"

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str) -> list[int]:
        """Ids of plain text: nothing added, special-token spellings encoded as ordinary text."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        try:
            return self._plain.encode(text, add_special_tokens=False).ids
        except TypeError:  # lone surrogates, which the library refuses: U+FFFD, as groundup's backend does
            return self._plain.encode(replace_surrogates(text), add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str], num_threads: int | None = None) -> list[list[int]]:
        """`encode` over many texts on the library's own thread pool (`num_threads` is not used:
        set RAYON_NUM_THREADS to limit it)."""
        texts = [replace_surrogates(t) if not t.isascii() else t for t in check_texts(texts)]
        batch = getattr(self._plain, "encode_batch_fast", self._plain.encode_batch)  # _fast: tokenizers >= 0.20
        return [e.ids for e in batch(texts, add_special_tokens=False)]

    def encode_rendered(self, text: str) -> list[int]:
        """Ids of text a chat template rendered: its special-token spellings become the specials."""
        return self._chat.encode(replace_surrogates(text), add_special_tokens=False).ids

    # ------------------------------------------------------------------ decoding

    @functools.cached_property
    def _pieces(self) -> list[bytes]:
        table = unicode_to_byte()
        pieces = [b""] * self._vocab_size
        for piece, i in self._chat.get_vocab(with_added_tokens=False).items():
            byte = _BYTE_PIECE.match(piece) if self._byte_fallback else None
            if byte:
                pieces[i] = bytes([int(byte.group(1), 16)])
            elif self._byte_level and all(c in table for c in piece):
                pieces[i] = bytes(table[c] for c in piece)
            else:
                pieces[i] = piece.replace("\u2581", " ").encode("utf-8", "surrogatepass")
        for i, content in self._added.items():
            pieces[i] = content.encode("utf-8", "surrogatepass")
        return pieces

    def id_to_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for; a special token's are its spelling."""
        return self._pieces[token_id]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text as the tokenizer's own decoder gives it (a SentencePiece decoder drops the leading space
        its pre-tokenizer added; `decode_bytes` keeps every byte)."""
        return self._chat.decode(self.check_ids(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self) -> np.ndarray:
        lengths = np.array([len(p) for p in self._pieces], dtype=np.int32)
        lengths[list(self._special)] = 0
        return lengths

    # ------------------------------------------------------------------ chat

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False,
                    tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
        """(ids, loss mask) through the chat template, as apply_chat_template renders and tokenizes it (`tools`
        reach the template as its `tools` variable, as transformers passes them)."""
        if self.chat_template is None:
            raise DataError(f"{self.files.where}: no chat template ({HF_TOKENIZER_CONFIG_FILE} has no chat_template)")
        return render_chat_ids(self.chat_template, messages, self.encode_rendered, add_generation_prompt,
                               self.token_strings, tools)

    def render_continuation(self, messages: Sequence[dict], new_messages: Sequence[dict],
                            add_generation_prompt: bool = True, tools: list[dict] | None = None) -> list[int]:
        """The ids rendering `new_messages` after `messages` adds: the template's text for the whole conversation
        past its text for `messages` (from the end-of-turn token that closes a last assistant turn), encoded;
        DataError when the template re-renders earlier turns (chat_template.continuation_text)."""
        if self.chat_template is None:
            raise DataError(f"{self.files.where}: no chat template ({HF_TOKENIZER_CONFIG_FILE} has no chat_template)")
        end = self._added.get(self.end_of_turn_id) if self.end_of_turn_id is not None else None
        return self.encode_rendered(continuation_text(self.chat_template, messages, new_messages, add_generation_prompt,
                                                      self.token_strings, tools, end))
