"""The chat format: a `messages` list rendered into token ids and an assistant-only loss mask.

    <|begin_of_text|><|system|>You are terse.<|end_of_turn|><|user|>2+2?<|end_of_turn|><|assistant|>4<|end_of_turn|>

Each message is its role token, its content encoded as plain text, and `<|end_of_turn|>`; the
conversation starts with `<|begin_of_text|>`; `add_generation_prompt` appends `<|assistant|>` so
a model continues with the assistant's reply and stops at `<|end_of_turn|>`. The loss mask is 1
on assistant content and on the end-of-turn token that closes it (the model must learn to stop),
0 everywhere else: the model is not trained to predict what users or the system say.

Tools (tool_calls.py): with `tools`, their definitions join the system turn; an assistant message's
`tool_calls` are written after its content as <tool_call>...</tool_call>; `tool` messages (results) are
a user turn of <tool_response>...</tool_response> (consecutive ones share one turn). Calls are assistant
text, so SFT learns them; results and definitions are not trained on. The four tags are single tokens
(TOOL_TOKENS, tool_tokens.py) where the tokenizer has them; the text they wrap stays text.

`render_continuation(tok, messages, new_messages)` is the ids rendering `new_messages` after `messages`
adds (a tool loop appends results and the next generation prompt to a running generation with it):
each message is encoded on its own, so they are exactly the tail of rendering the whole conversation.

Content is encoded with `Tokenizer.encode`, so a message that spells `<|user|>` cannot forge a turn.
`CHAT_TEMPLATE` is the same format as a Jinja template for `tokenizer_config.json`; it renders the
same ids through `transformers` (whose tokenizer, unlike ours, does turn such literal spellings in
content into special tokens, as every Hugging Face chat template does).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Sequence

from groundup.errors import DataError
from groundup.tokenizer.tool_calls import (CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN, TOOLS_FOOTER,
                                           TOOLS_HEADER, check_tools)
from groundup.tokenizer.tool_tokens import TOOL_TOKENS, call_parts, response_parts, split_parts, tools_parts

if TYPE_CHECKING:
    from groundup.tokenizer.tokenizer import Tokenizer

CHAT_ROLES = ROLES = ("system", "user", "assistant")

# Special-token spellings by role in the tokenizer; the order fixes their ids after the vocabulary.
SPECIAL_TOKENS = {
    "bos": "<|begin_of_text|>",
    "eot": "<|end_of_text|>",
    "pad": "<|pad|>",
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "end_of_turn": "<|end_of_turn|>",
}
__all__ = ["CHAT_ROLES", "ROLES", "SPECIAL_TOKENS", "TOOL_TOKENS", "chat_template", "check_messages",
           "render_chat", "render_continuation", "with_tools"]


def chat_template(names: dict[str, str] = SPECIAL_TOKENS) -> str:
    """The chat format as a Jinja template (the `chat_template` of `tokenizer_config.json`), tools included."""
    roles = ", ".join(f"'{r}': '{names[r]}'" for r in ROLES)
    eot, j = names["end_of_turn"], json.dumps
    return (
        "{%- set role_tokens = {" + roles + "} -%}"
        "{{- '" + names["bos"] + "' -}}"
        "{%- set tools_text = '' -%}"
        "{%- if tools -%}{%- set ns = namespace(lines=[]) -%}"
        "{%- for tool in tools -%}{%- set ns.lines = ns.lines + [tool | tojson] -%}{%- endfor -%}"
        "{%- set tools_text = " + j(TOOLS_HEADER) + " + ns.lines | join('\\n') + " + j(TOOLS_FOOTER) + " -%}"
        "{%- endif -%}"
        "{%- if tools and messages[0]['role'] != 'system' -%}"
        "{{- role_tokens['system'] + tools_text + '" + eot + "' -}}{%- endif -%}"
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'tool' -%}"
        "{%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- role_tokens['user'] -}}"
        "{%- else -%}{{- '\\n' -}}{%- endif -%}"
        "{{- " + j(RESPONSE_OPEN) + " + message['content'] + " + j(RESPONSE_CLOSE) + " -}}"
        "{%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '" + eot + "' -}}{%- endif -%}"
        "{%- else -%}"
        "{%- if message['role'] not in role_tokens -%}"
        "{{- raise_exception('chat role must be system, user, assistant or tool, not ' + message['role']) -}}"
        "{%- endif -%}"
        "{{- role_tokens[message['role']] + (message['content'] or '') -}}"
        "{%- if message['role'] == 'system' and tools_text -%}"
        "{{- ('\\n\\n' if message['content'] else '') + tools_text -}}{%- endif -%}"
        "{%- for call in message.get('tool_calls') or [] -%}"
        "{%- set fn = call['function'] if call['function'] is defined else call -%}"
        "{{- ('\\n' if message['content'] or not loop.first else '') + " + j(CALL_OPEN + "\n") + " -}}"
        "{{- '{\\\"name\\\": ' + (fn['name'] | tojson) + ', \\\"arguments\\\": ' -}}"
        "{{- (fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson) + '}' -}}"
        "{{- " + j("\n" + CALL_CLOSE) + " -}}"
        "{%- endfor -%}"
        "{{- '" + eot + "' -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '" + names["assistant"] + "' -}}{%- endif -%}"
    )


def check_messages(messages: Any, where: str = "messages") -> None:
    """Raise DataError naming the message and reason unless `messages` is a valid chat."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise DataError(f"{where}: expected a non-empty list of {{role, content}} messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DataError(f"{where}[{i}]: expected an object with role and content, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in (*ROLES, "tool"):
            raise DataError(f"{where}[{i}]: role {role!r} is not one of {', '.join(ROLES)}, tool")
        calls = message.get("tool_calls")
        if calls is not None and (role != "assistant" or not isinstance(calls, list)):
            raise DataError(f"{where}[{i}]: tool_calls belong to an assistant message, as a list")
        if not isinstance(content, str) and not (content is None and calls):
            raise DataError(f"{where}[{i}]: content must be a string, got {type(content).__name__}")


def with_tools(messages: Sequence[dict], tools: list[dict] | None) -> list[dict]:
    """The conversation in the three roles the format has: tool definitions in the system turn, calls in
    the assistant's text, results in a user turn (see the module docstring). Each message's text is its
    `parts` (tool_tokens.py: the tags the format writes are Tags)."""
    out: list[dict] = []
    if tools:
        check_tools(tools)
        if messages[0]["role"] != "system":
            out.append({"role": "system", "parts": tools_parts(tools)})
    for m in messages:
        if m["role"] == "tool":
            piece = response_parts(m["content"])
            if out and out[-1].get("tool"):
                out[-1]["parts"] += ["\n", *piece]
            else:
                out.append({"role": "user", "parts": piece, "tool": True})
            continue
        content = m.get("content") or ""
        parts = [content] if content else []
        if m["role"] == "system" and tools:
            parts += (["\n\n"] if content else []) + tools_parts(tools)
        for k, call in enumerate(m.get("tool_calls") or []):
            parts += (["\n"] if content or k else []) + call_parts(call)
        out.append({"role": m["role"], "parts": parts})
    return out


def _encode_turns(tok: "Tokenizer", turns: list[dict], add_generation_prompt: bool) -> tuple[list[int], list[int]]:
    """Each turn as its role token, its text (tags as their ids), end of turn; mask 1 on the assistant's."""
    role_ids = {"system": tok.system_id, "user": tok.user_id, "assistant": tok.assistant_id}
    pieces = [split_parts(t["parts"], tok.tool_ids) for t in turns]
    texts = iter(tok.encode_batch([p for turn in pieces for p in turn if isinstance(p, str)]))
    ids, mask = [], []
    for turn, turn_pieces in zip(turns, pieces):
        learn = 1 if turn["role"] == "assistant" else 0
        ids.append(role_ids[turn["role"]])
        mask.append(0)
        start = len(ids)
        for piece in turn_pieces:
            ids.extend(next(texts) if isinstance(piece, str) else [piece])
        ids.append(tok.end_of_turn_id)
        mask.extend([learn] * (len(ids) - start))
    if add_generation_prompt:
        ids.append(tok.assistant_id)
        mask.append(0)
    return ids, mask


def render_chat(tok: "Tokenizer", messages: Sequence[dict], add_generation_prompt: bool = False,
                tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (same length) for a conversation; see the module docstring."""
    check_messages(messages)
    ids, mask = _encode_turns(tok, with_tools(messages, tools), add_generation_prompt)
    return [tok.bos_id, *ids], [0, *mask]


def render_continuation(tok: "Tokenizer", messages: Sequence[dict], new_messages: Sequence[dict],
                        add_generation_prompt: bool = True, tools: list[dict] | None = None) -> list[int]:
    """The ids rendering `new_messages` after `messages` adds (all of it when `messages` is empty): exactly
    render_chat(messages + new_messages)[len(render_chat(messages)):]. DataError when the earlier turns would
    render differently: a tool result right after one that `messages` ends with joins its turn."""
    check_messages(new_messages, "new_messages")
    if not messages:
        return render_chat(tok, new_messages, add_generation_prompt, tools)[0]
    check_messages(messages)
    before = with_tools(messages, tools)
    turns = with_tools([*messages, *new_messages], tools)
    if turns[: len(before)] != before:
        raise DataError("new_messages: a tool result that follows the tool result `messages` ends with joins its "
                        "user turn, which is already rendered; pass all the results of one assistant turn together")
    return _encode_turns(tok, turns[len(before):], add_generation_prompt)[0]
