"""Fine-tuning records in the formats people already have, normalised to one shape.

    for ex in iter_examples(["chat.jsonl", "alpaca.parquet"], stats):
        ex.messages        # [{"role", "content"}, ...] (empty for plain text)
        ex.completion_at   # index of the first completion message (prompt-completion records; else the last turn)
        ex.tools           # the record's tool definitions (OpenAI's shape) or None
        ex.text            # plain-text records only

Accepted, each as JSONL or Parquet rows (read through groundup.data's one reader, so hostile lines
are skipped and counted like everywhere else):
- TRL conversational: `messages` = [{role, content}], an optional system message first;
- TRL prompt-completion: `prompt` and `completion`, each plain text or a list of messages;
- plain `text` (language-model fine-tuning on documents);
- ShareGPT: `conversations` = [{from: system|human|gpt, value}], with an optional `system` field;
- Alpaca: `instruction`, optional `input`, `output`.
A record that fits none of them, or whose messages are malformed, is skipped and counted with its
`file:line` and the reason.

Tool use, as OpenAI and TRL write it: a record-level `tools` list of function definitions; assistant
messages with `tool_calls` = [{id, type: "function", function: {name, arguments}}] (arguments a JSON
object or its text; content optional or null); `role: "tool"` messages with the result as content and a
`tool_call_id` naming an earlier call. ShareGPT as LLaMA-Factory writes it: `from: function_call` turns
(value: the JSON {name, arguments}, or a list of them) and `from: observation` turns (the result), and
`tools` as a JSON string or a list (bare definitions {name, description, parameters} are wrapped in
OpenAI's {type: "function", function: ...}). Normalised: a call's arguments become a JSON object (the
template writes them back with json.dumps' separators, as the server's constrained decoding does), a
call without an id gets `call_<message>_<call>`, and ShareGPT results name the calls they answer in order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from groundup.data.readers import ReadStats, iter_records
from groundup.errors import DataError
from groundup.tokenizer.chat import ROLES
from groundup.tokenizer.tool_calls import check_tools

SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "observation": "tool",
                  "function_call": "assistant"}
FORMATS = ("messages", "prompt-completion", "text", "sharegpt", "alpaca")
MESSAGE_ROLES = (*ROLES, "tool")


@dataclass
class Example:
    id: str
    format: str  # one of FORMATS
    messages: list[dict] = field(default_factory=list)
    completion_at: int = -1  # first message of the completion (chat formats)
    prompt_text: str | None = None  # prompt-completion with plain text
    completion_text: str | None = None
    text: str | None = None  # plain text
    meta: dict = field(default_factory=dict)  # the record's other fields (e.g. `answer`, `split`)
    tools: list[dict] | None = None  # tool definitions the chat template shows (OpenAI's `tools`)


class BadRecord(ValueError):
    """A record that no accepted format describes (the reason is the message)."""


def parse_tools(value, key: str = "tools") -> list[dict] | None:
    """A record's tool definitions in OpenAI's shape; None when it has none (see the module docstring)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):  # LLaMA-Factory stores the list as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise BadRecord(f"'{key}' is text but not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(value, list):
        raise BadRecord(f"'{key}' must be a list of tool definitions, got {type(value).__name__}")
    tools = [{"type": "function", "function": t} if isinstance(t, dict) and "function" not in t and "name" in t
             else t for t in value]
    try:
        return check_tools(tools, key) or None
    except DataError as e:
        raise BadRecord(str(e)) from None


def _call(value, where: str, default_id: str) -> dict:
    """One OpenAI tool call, normalised: {id, type: "function", function: {name, arguments: object}}."""
    fn = value.get("function") if isinstance(value, dict) else None
    if not isinstance(fn, dict) or value.get("type", "function") != "function":
        raise BadRecord(f"{where}: expected {{id, type: \"function\", function: {{name, arguments}}}}")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise BadRecord(f"{where}.function.name: expected a non-empty string")
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise BadRecord(f"{where}.function.arguments: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(arguments, dict):
        raise BadRecord(f"{where}.function.arguments: expected a JSON object, got {type(arguments).__name__}")
    call_id = value.get("id", default_id)
    if not isinstance(call_id, str) or not call_id:
        raise BadRecord(f"{where}.id: expected a non-empty string")
    return {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": arguments}}


def parse_messages(value, key: str) -> list[dict]:
    """Messages in the chat format's roles, tool calls and results included (see the module docstring)."""
    if not isinstance(value, list) or not value:
        raise BadRecord(f"'{key}' must be a non-empty list of {{role, content}} messages")
    out, call_ids = [], set()
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise BadRecord(f"{key}[{i}] is {type(m).__name__}, expected an object with role and content")
        role, content, calls = m.get("role"), m.get("content"), m.get("tool_calls")
        if role not in MESSAGE_ROLES:
            raise BadRecord(f"{key}[{i}].role = {role!r}: expected one of {', '.join(MESSAGE_ROLES)}")
        if calls is not None and not isinstance(calls, list):
            raise BadRecord(f"{key}[{i}].tool_calls must be a list of calls, got {type(calls).__name__}")
        if calls and role != "assistant":  # an empty list is none (Parquet fills the column in every row)
            raise BadRecord(f"{key}[{i}].tool_calls: only an assistant message calls tools")
        if calls:  # the content of a message that calls is optional
            if content is not None and not isinstance(content, str):
                raise BadRecord(f"{key}[{i}].content must be a string or null, got {type(content).__name__}")
            parsed = [_call(c, f"{key}[{i}].tool_calls[{j}]", f"call_{i}_{j}") for j, c in enumerate(calls)]
            call_ids.update(c["id"] for c in parsed)
            out.append({"role": role, "content": content, "tool_calls": parsed})
            continue
        if not isinstance(content, str):
            raise BadRecord(f"{key}[{i}].content must be a string, got {type(content).__name__}")
        message = {"role": role, "content": content}
        if role == "tool":
            call_id = m.get("tool_call_id")
            if call_id is None and not call_ids:
                raise BadRecord(f"{key}[{i}]: a tool result with no tool call before it")
            if call_id is not None and call_id not in call_ids:
                raise BadRecord(f"{key}[{i}].tool_call_id = {call_id!r} matches no earlier tool call's id")
            message.update({k: m[k] for k in ("tool_call_id", "name") if isinstance(m.get(k), str)})
        out.append(message)
    return out


def _check_turns(messages: list[dict], key: str) -> int:
    """The index of the last assistant message (the example's completion). A chat ends with it, or with the
    results of its calls: a trajectory split to the context (`data trajectories`) keeps a call with its
    results, so a piece cut inside a tool loop ends with them."""
    last = len(messages) - 1
    while last >= 0 and messages[last]["role"] == "tool":
        last -= 1
    if last < 0 or messages[last]["role"] != "assistant" or (last < len(messages) - 1
                                                             and not messages[last].get("tool_calls")):
        raise BadRecord(f"'{key}' must end with an assistant message (what the model learns to say), or with "
                        "the results of its tool calls")
    if any(m["role"] == "system" for m in messages[1:]):
        raise BadRecord(f"'{key}': a system message may only come first")
    return last


def _sharegpt_calls(value: str, where: str) -> list[dict]:
    """A function_call turn's value: the JSON {name, arguments}, or a list of them."""
    try:
        calls = json.loads(value)
    except json.JSONDecodeError as e:
        raise BadRecord(f"{where}.value: a function call that is not JSON ({e.msg} at character {e.pos})") from None
    calls = calls if isinstance(calls, list) else [calls]
    if not calls or not all(isinstance(c, dict) for c in calls):
        raise BadRecord(f"{where}.value: expected a JSON object {{name, arguments}} or a list of them")
    return [{"type": "function", "function": {"name": c.get("name"), "arguments": c.get("arguments", {})}}
            for c in calls]


def sharegpt_messages(turns, system=None) -> list[dict]:
    """ShareGPT (and LLaMA-Factory's function_call / observation) turns as OpenAI messages, checked."""
    if not isinstance(turns, list) or not turns:
        raise BadRecord("'conversations' must be a non-empty list of {from, value}")
    messages: list[dict] = []
    pending: list[dict] = []  # calls of the last function_call turn not yet answered
    for i, t in enumerate(turns):
        if not isinstance(t, dict) or t.get("from") not in SHAREGPT_ROLES or not isinstance(t.get("value"), str):
            raise BadRecord(f"conversations[{i}]: expected {{from: system|human|gpt|function_call|observation, "
                            "value: text}")
        role = SHAREGPT_ROLES[t["from"]]
        if t["from"] == "function_call":
            calls = _sharegpt_calls(t["value"], f"conversations[{i}]")
            for j, c in enumerate(calls):
                c["id"] = f"call_{i}_{j}"
            pending = list(calls)
            last = messages[-1] if messages else {}
            if last.get("role") == "assistant" and not last.get("tool_calls"):  # "gpt" thought, then its call
                last["tool_calls"] = calls
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        elif role == "tool":
            message = {"role": "tool", "content": t["value"]}
            if pending:
                message["tool_call_id"] = pending.pop(0)["id"]
            messages.append(message)
        else:
            messages.append({"role": role, "content": t["value"]})
    if isinstance(system, str) and system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    return parse_messages(messages, "conversations")


def to_example(record: dict) -> Example:
    """The record as an Example; BadRecord naming the problem when no format fits."""
    rid = str(record.get("id", ""))
    meta = {k: v for k, v in record.items() if not k.startswith("_") and k not in (
        "messages", "prompt", "completion", "conversations", "instruction", "input", "output", "tools")}
    if "messages" in record:
        messages = parse_messages(record["messages"], "messages")
        last = _check_turns(messages, "messages")
        return Example(rid, "messages", messages, completion_at=last, meta=meta,
                       tools=parse_tools(record.get("tools")))
    if "prompt" in record or "completion" in record:
        prompt, completion = record.get("prompt"), record.get("completion")
        if isinstance(prompt, str) and isinstance(completion, str):
            if not completion:
                raise BadRecord("'completion' is empty")
            return Example(rid, "prompt-completion", prompt_text=prompt, completion_text=completion, meta=meta)
        if isinstance(prompt, list) and isinstance(completion, list):
            p, c = parse_messages(prompt, "prompt"), parse_messages(completion, "completion")
            _check_turns(p + c, "prompt + completion")
            if any(m["role"] != "assistant" for m in c):
                raise BadRecord("'completion' messages must all be the assistant's")
            return Example(rid, "prompt-completion", p + c, completion_at=len(p), meta=meta,
                           tools=parse_tools(record.get("tools")))
        raise BadRecord("'prompt' and 'completion' must both be strings or both be lists of messages")
    if "conversations" in record:
        system = record.get("system")
        messages = sharegpt_messages(record["conversations"], system)
        last = _check_turns(messages, "conversations")
        if isinstance(system, str):
            meta.pop("system", None)
        return Example(rid, "sharegpt", messages, completion_at=last, meta=meta,
                       tools=parse_tools(record.get("tools")))
    if "instruction" in record and "output" in record:
        instruction, extra, output = record["instruction"], record.get("input") or "", record["output"]
        if not all(isinstance(x, str) for x in (instruction, extra, output)) or not output:
            raise BadRecord("Alpaca fields 'instruction', 'input' and 'output' must be strings, 'output' non-empty")
        user = instruction + (f"\n\n{extra}" if extra else "")
        return Example(rid, "alpaca", [{"role": "user", "content": user}, {"role": "assistant", "content": output}],
                       completion_at=1, meta=meta)
    if isinstance(record.get("text"), str):
        if not record["text"]:
            raise BadRecord("'text' is empty")
        return Example(rid, "text", text=record["text"], meta=meta)
    keys = sorted(k for k in record if not k.startswith("_") and k not in ("id", "source", "domain"))
    raise BadRecord(f"no known format: expected one of messages, prompt/completion, text, conversations (ShareGPT) "
                    f"or instruction/output (Alpaca); the record has {keys[:6]}")


def iter_examples(paths: Sequence[str | Path], stats: ReadStats | None = None,
                  bad: list[str] | None = None) -> Iterator[Example]:
    """Examples from JSONL/Parquet files; bad records are counted in `stats` and listed in `bad`."""
    stats = stats if stats is not None else ReadStats()
    for record in iter_records(paths, stats, require_text=False):
        try:
            yield to_example(record)
        except BadRecord as e:
            where = record.get("_where", record.get("id", "?"))
            stats.note("bad_field", f"{where}: {e}")
            if bad is not None:
                bad.append(f"{where}: {e}")


def no_usable_held_out(flag: str, paths, what: str, counted: str, first: list[str]) -> DataError:
    """The error for held-out files the user named (`--eval-data`, `--eval-prompts`) without one usable
    record: running on as if none were given would hide them."""
    shown = f"; first: {'; '.join(first)}" if first else ""
    return DataError(f"{flag} {', '.join(map(str, paths))}: no usable {what} ({counted}{shown})")

