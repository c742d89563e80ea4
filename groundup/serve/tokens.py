"""Text and token ids at the server's edge: prompts, chats, token strings, tokenizer facts.

- Prompts and chats are encoded by the engine's one prompt path (groundup/infer/prompts.py), so a
  request gets the token ids `groundup generate` and `chat` give it: a completions prompt (and
  `/tokenize`'s) is the tokenizer's prefix, then the text with special-token spellings such as
  `<|end_of_text|>` read as those tokens, as vLLM and Hugging Face tokenizers read a raw prompt (so
  lm-evaluation-harness finds the end-of-text id through `/tokenize`); chat messages go through the
  chat format (with `tools`, the template writes the definitions). A prompt given as token ids is used as
  it is.
- A token's string is its own decoding (special tokens spelled out; a lone byte of a multi-byte
  character shows as U+FFFD, its `bytes` say what it is).
"""

from __future__ import annotations

import json
from typing import Sequence

from groundup.infer.prompts import PromptEncoder
from groundup.tokenizer.tool_calls import CALL_CLOSE, CALL_OPEN, call_text
from groundup.serve.protocol import APIError, ChatMessage


def _plain(i: int, m: ChatMessage, renders_calls: bool = True) -> dict:
    """A message as chat templates read it: developer is system; a call's arguments are an object (Hugging
    Face templates write them with `tojson`; groundup's writes them back with json.dumps' separators). For a
    template that never reads `tool_calls` (SmolLM2's), the calls join the content as <tool_call> text, so
    the model sees the calls its results answer and the template gets a string, never a missing content."""
    out = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
    if m.tool_calls:
        out["content"] = m.text() or None
        out["tool_calls"] = []
        for j, call in enumerate(m.tool_calls):
            try:
                arguments = json.loads(call.function.arguments)
            except json.JSONDecodeError as e:
                where = f"messages.{i}.tool_calls.{j}.function.arguments"
                raise APIError(400, f"{where}: not JSON ({e})", param=where) from None
            out["tool_calls"].append({"id": call.id, "type": "function",
                                      "function": {"name": call.function.name, "arguments": arguments}})
        if not renders_calls:
            written = "\n".join(call_text(c) for c in out["tool_calls"])
            out["content"] = (out["content"] + "\n" if out["content"] else "") + written
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None and m.role == "tool":
        out["name"] = m.name
    return out


class TokenText:
    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.prompts = PromptEncoder(tokenizer)  # the engine's one prompt path
        self.renders_calls = "tool_calls" in (tokenizer.chat_template or "")  # else _plain writes them as text
        self._strings: dict[int, str] = {}

    # ------------------------------------------------------------------ text -> ids

    def encode(self, text: str, add_prefix: bool = True) -> list[int]:
        return self.prompts.encode(text, add_prefix)

    def chat(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
             tools: list[dict] | None = None) -> list[int]:
        plain = [_plain(i, m, self.renders_calls) for i, m in enumerate(messages)]
        try:
            return self.prompts.chat(plain, add_generation_prompt, tools)
        except Exception as e:  # noqa: BLE001 - DataError, or a Jinja template's own exception
            raise APIError(400, f"messages: {e}", param="messages") from None

    def tool_tag_ids(self) -> tuple[int, int] | None:
        """The single tokens spelling <tool_call> and </tool_call>, where the tokenizer has them (groundup's
        tokenizers trained since the tool tokens, Qwen's): special or added (non-special) tokens alike."""
        ids = self.tok.added_token_id(CALL_OPEN), self.tok.added_token_id(CALL_CLOSE)
        return ids if None not in ids else None

    def check_ids(self, ids: Sequence[int], param: str) -> list[int]:
        vocab = self.tok.vocab_size
        for i in ids:
            if not isinstance(i, int) or not 0 <= i < vocab:
                raise APIError(400, f"{param}: token id {i} is outside the vocabulary (0..{vocab - 1})", param=param)
        return list(ids)

    # ------------------------------------------------------------------ ids -> text

    def string(self, token_id: int) -> str:
        s = self._strings.get(token_id)
        if s is None:
            s = self._strings[token_id] = self.tok.decode([token_id])
        return s

    def bytes(self, token_id: int) -> list[int]:
        return list(self.tok.id_to_bytes(token_id))

    def shown_length(self, token_id: int) -> int:
        """Characters the token adds to a response's text (special tokens are not shown)."""
        return 0 if self.tok.is_special(token_id) else len(self.string(token_id))

    def info(self, context: int) -> dict:
        """`/tokenizer_info`, as vLLM answers it. lm-evaluation-harness reads `eos_token`, `chat_template`
        and `bos_token`, which it puts before an empty context: so `bos_token` here is the token this
        tokenizer puts before a document (`prefix_ids`: groundup's end-of-text), and the chat format's
        begin-of-text token is `chat_bos_token`."""
        tok = self.tok
        prefix = list(tok.prefix_ids)

        def spelling(i):
            return None if i is None else self.string(i)

        return {"tokenizer_class": type(tok).__name__, "backend": tok.backend, "vocab_size": tok.vocab_size,
                "model_max_length": context, "eos_token": spelling(tok.eot_id),
                "bos_token": spelling(prefix[0]) if prefix else None, "chat_bos_token": spelling(tok.bos_id),
                "pad_token": spelling(tok.pad_id), "end_of_turn_token": spelling(tok.end_of_turn_id),
                "stop_token_ids": sorted(tok.stop_ids), "prefix_token_ids": list(tok.prefix_ids),
                "chat_template": tok.chat_template, "hash": tok.hash}
