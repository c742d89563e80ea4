"""The four tool tags as single tokens, and chat text cut so the tags the format writes become them.

    TOOL_TOKENS = {"tool_call": "<tool_call>", "tool_call_end": "</tool_call>",
                   "tool_response": "<tool_response>", "tool_response_end": "</tool_response>"}

Every groundup tokenizer trained since these existed has them, right after its seven special tokens and
in this order. They are what Hugging Face calls added tokens that are not special (Qwen2.5 has the same
four): decoding shows them even with skip_special_tokens, `token_bytes` counts their spelling, and
`encode` never produces them, so plain text (a document, a user's message, a tool's result) that spells
a tag stays text and cannot forge a call. A tokenizer saved before them (seven specials) still loads and
writes the tags as the plain text they always were.

Only tags the format itself writes become tokens: `tools_parts`, `call_parts` and `response_parts`
return a message's text as a list of strs in which each such tag is a `Tag`; what they wrap (tool
definitions, a call's name and arguments, a result) is ordinary text. `"".join(parts)` is the text
tool_calls.py writes, which a tokenizer without the tokens encodes as before; `split_parts` gives the
text runs between tags, each encoded on its own, as `tokenizers` encodes the text between added tokens.
"""

from __future__ import annotations

import json
import re

from groundup.tokenizer.tool_calls import (CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN, TOOLS_FOOTER,
                                           TOOLS_HEADER, call_text)

TOOL_TOKENS = {"tool_call": CALL_OPEN, "tool_call_end": CALL_CLOSE,
               "tool_response": RESPONSE_OPEN, "tool_response_end": RESPONSE_CLOSE}
_TAG_SPLIT = re.compile("(" + "|".join(map(re.escape, TOOL_TOKENS.values())) + ")")


class Tag(str):
    """A tool tag the format writes (one token where the tokenizer has the tool tokens); text is a plain str."""


def format_parts(text: str) -> list[str]:
    """Text the format itself writes (never a user's), its tag spellings as Tags."""
    return [Tag(p) if k % 2 else p for k, p in enumerate(_TAG_SPLIT.split(text)) if p]


def tools_parts(tools: list[dict]) -> list[str]:
    """tool_calls.tools_text as parts: the header's and footer's tags are Tags, the definitions text."""
    return [*format_parts(TOOLS_HEADER), "\n".join(json.dumps(t, ensure_ascii=False) for t in tools),
            *format_parts(TOOLS_FOOTER)]


def call_parts(call: dict) -> list[str]:
    """tool_calls.call_text as parts: the two tags around the call's JSON text."""
    text = call_text(call)
    return [Tag(CALL_OPEN), text[len(CALL_OPEN): len(text) - len(CALL_CLOSE)], Tag(CALL_CLOSE)]


def response_parts(content: str) -> list[str]:
    """tool_calls.response_text as parts: the result is text, whatever it spells."""
    return [Tag(RESPONSE_OPEN), content, Tag(RESPONSE_CLOSE)]


def split_parts(parts: list[str], tag_ids: dict[str, int]) -> list[str | int]:
    """Text runs (adjacent text joined, empty runs dropped) and the ids of the Tags `tag_ids` holds (spelling
    -> id); without the tokens (`tag_ids` empty) the whole message is one text, as before them."""
    out: list[str | int] = []
    text = ""
    for part in parts:
        if isinstance(part, Tag) and part in tag_ids:
            if text:
                out.append(text)
            out.append(tag_ids[part])
            text = ""
        else:
            text += part
    if text:
        out.append(text)
    return out
