"""One prompt path: the token ids of a prompt, whichever command sends it (generate, chat, eval, serve).

    prompts = PromptEncoder(tokenizer)
    prompts.encode("To be, or not")            # the tokenizer's prefix (groundup: end-of-text), then the text
    prompts.encode_batch(["a", "b<|end_of_text|>c"])
    prompts.chat([{"role": "user", "content": "2+3?"}])   # the chat format, ready for the reply

A plain prompt starts with the tokenizer's prefix (`prefix_ids`: the context every training document
starts in), and special-token spellings in its text (`<|end_of_text|>`) are those special tokens, as
vLLM and Hugging Face tokenizers read a raw prompt. Chat messages go through the tokenizer's chat format,
where message content is plain text: a user cannot forge a turn by typing a role marker.
"""

from __future__ import annotations

import re
from typing import Sequence


class PromptEncoder:
    def __init__(self, tokenizer):
        self.tok = tokenizer
        specials = {tokenizer.decode([i]): i for i in sorted(tokenizer.special_token_ids)}
        self.specials = {s: i for s, i in specials.items() if s}
        spellings = sorted(self.specials, key=len, reverse=True)
        self.pattern = re.compile("(" + "|".join(map(re.escape, spellings)) + ")") if spellings else None

    def encode(self, text: str, add_prefix: bool = True) -> list[int]:
        return self.encode_batch([text], add_prefix)[0]

    def encode_batch(self, texts: Sequence[str], add_prefix: bool = True) -> list[list[int]]:
        prefix = list(self.tok.prefix_ids) if add_prefix else []
        plain = [i for i, t in enumerate(texts) if self.pattern is None or not self.pattern.search(t)]
        out: list[list[int] | None] = [None] * len(texts)
        for i, ids in zip(plain, self.tok.encode_batch([texts[i] for i in plain]) if plain else []):
            out[i] = prefix + ids
        for i, text in enumerate(texts):
            if out[i] is None:
                ids = list(prefix)
                for k, piece in enumerate(self.pattern.split(text)):
                    if k % 2:
                        ids.append(self.specials[piece])
                    elif piece:
                        ids.extend(self.tok.encode(piece))
                out[i] = ids
        return out

    def chat(self, messages: Sequence[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None,
             ) -> list[int]:
        ids, _ = self.tok.render_chat(list(messages), add_generation_prompt=add_generation_prompt, tools=tools)
        return ids
