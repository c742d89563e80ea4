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
text, so SFT learns them; results and definitions are not trained on.

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
                                           TOOLS_HEADER, call_text, check_tools, response_text, tools_text)

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
    the assistant's text, results in a user turn (see the module docstring)."""
    out: list[dict] = []
    if tools:
        check_tools(tools)
        if messages[0]["role"] != "system":
            out.append({"role": "system", "content": tools_text(tools)})
    for m in messages:
        if m["role"] == "tool":
            piece = response_text(m["content"])
            if out and out[-1].get("tool"):
                out[-1]["content"] += "\n" + piece
            else:
                out.append({"role": "user", "content": piece, "tool": True})
            continue
        content = m.get("content") or ""
        if m["role"] == "system" and tools:
            content = (content + "\n\n" if content else "") + tools_text(tools)
        calls = [call_text(c) for c in m.get("tool_calls") or []]
        if calls:
            content = (content + "\n" if content else "") + "\n".join(calls)
        out.append({"role": m["role"], "content": content})
    return out


def render_chat(tok: "Tokenizer", messages: Sequence[dict], add_generation_prompt: bool = False,
                tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (same length) for a conversation; see the module docstring."""
    check_messages(messages)
    messages = with_tools(messages, tools)
    role_ids = {"system": tok.system_id, "user": tok.user_id, "assistant": tok.assistant_id}
    contents = tok.encode_batch([m["content"] for m in messages])
    ids, mask = [tok.bos_id], [0]
    for message, content in zip(messages, contents):
        learn = 1 if message["role"] == "assistant" else 0
        ids.append(role_ids[message["role"]])
        mask.append(0)
        ids.extend(content)
        ids.append(tok.end_of_turn_id)
        mask.extend([learn] * (len(content) + 1))
    if add_generation_prompt:
        ids.append(tok.assistant_id)
        mask.append(0)
    return ids, mask
