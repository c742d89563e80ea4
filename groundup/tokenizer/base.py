"""The tokenizer interface every backend implements; code outside `groundup.tokenizer` depends on this only.

Two backends: groundup's own byte-level BPE (`Tokenizer`, backend "groundup") and any Hugging Face
`tokenizer.json` (`HFTokenizer`, backend "huggingface"). `groundup.tokenizer.load_tokenizer(path)`
picks the right one for a directory. What every backend promises:

    vocab_size, hash                  ids 0..vocab_size-1; 16 hex digits identifying the tokenization
    encode(text) -> list[int]         no special tokens added, and special-token spellings in the
                                      text stay ordinary text (a document cannot forge a turn)
    encode_batch(texts, num_threads)  encode_to_numpy(text) -> uint32 array
    decode(ids, skip_special_tokens)  decode_bytes(ids, ...) -> bytes; id_to_bytes(id) -> bytes
    token_bytes() -> int32 array      bytes each id stands for, 0 for specials (bits-per-byte denominator)
    is_special(id), special_token_ids frozenset; specials need not sit at the end of the vocabulary
    bos_id, pad_id                    may be None
    eot_id (= eos_id)                 end of text: the document separator in token shards
    end_of_turn_id                    closes an assistant turn in the chat template (None: no template)
    stop_ids                          frozenset of ids that end generation
    prefix_ids                        ids put before a plain document or prompt ([eot] for groundup's,
                                      what the post-processor adds for Hugging Face's, e.g. [bos])
    special_ids                       role -> id, e.g. {"bos": 1, "eot": 2, ...}
    added_token_id(spelling)          the one token a template's spelling becomes (a special, or an added
                                      token that is not special such as <tool_call>), None if it is text
    chat_template                     Jinja source or None
    render_chat(messages, add_generation_prompt, tools) -> (ids, loss_mask)
                                      mask 1 on assistant content and the token(s) ending its turn
    render_continuation(messages, new_messages, add_generation_prompt, tools) -> ids
                                      what rendering new_messages after messages adds (a tool loop
                                      appends results to a running generation with it); DataError
                                      when the format would re-render the earlier turns
    save(directory), backend          "groundup" or "huggingface"
"""

from __future__ import annotations

import abc
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np


def replace_surrogates(text: str) -> str:
    """Lone surrogates (no UTF-8 text can hold them) as U+FFFD, which is how every backend encodes them."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class BaseTokenizer(abc.ABC):
    backend: str
    bos_id: int | None
    eot_id: int | None
    pad_id: int | None
    end_of_turn_id: int | None
    special_ids: dict[str, int]

    # ------------------------------------------------------------------ identity

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def hash(self) -> str: ...

    @property
    @abc.abstractmethod
    def special_token_ids(self) -> frozenset[int]: ...

    @property
    @abc.abstractmethod
    def stop_ids(self) -> frozenset[int]: ...

    @property
    @abc.abstractmethod
    def prefix_ids(self) -> list[int]: ...

    @property
    @abc.abstractmethod
    def chat_template(self) -> str | None: ...

    @property
    def eos_id(self) -> int | None:
        return self.eot_id

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_token_ids

    @abc.abstractmethod
    def added_token_id(self, spelling: str) -> int | None: ...

    # ------------------------------------------------------------------ encoding and decoding

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Iterable[str], num_threads: int | None = None) -> list[list[int]]:
        return [self.encode(t) for t in check_texts(texts)]

    def encode_to_numpy(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.uint32)

    @abc.abstractmethod
    def id_to_bytes(self, token_id: int) -> bytes: ...

    def decode_bytes(self, ids: Any, skip_special_tokens: bool = False) -> bytes:
        ids = self.check_ids(ids)
        if skip_special_tokens:
            ids = [i for i in ids if not self.is_special(i)]
        return b"".join(self.id_to_bytes(i) for i in ids)

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    @abc.abstractmethod
    def token_bytes(self) -> np.ndarray: ...

    def check_ids(self, ids: Any) -> list[int]:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")
        return ids

    # ------------------------------------------------------------------ chat and files

    @abc.abstractmethod
    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False,
                    tools: list[dict] | None = None) -> tuple[list[int], list[int]]: ...

    @abc.abstractmethod
    def render_continuation(self, messages: Sequence[dict], new_messages: Sequence[dict],
                            add_generation_prompt: bool = True, tools: list[dict] | None = None) -> list[int]: ...

    @abc.abstractmethod
    def save(self, directory: str | os.PathLike) -> Path: ...


def check_texts(texts: Iterable[str]) -> list[str]:
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"encode_batch: item {i} is {type(text).__name__}, expected str")
    return texts
