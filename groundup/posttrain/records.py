"""Fine-tuning records in the formats people already have, normalised to one shape.

    for ex in iter_examples(["chat.jsonl", "alpaca.parquet"], stats):
        ex.messages        # [{"role", "content"}, ...] (empty for plain text)
        ex.completion_at   # index of the first completion message (prompt-completion records; else the last turn)
        ex.text            # plain-text records only

Accepted, each as JSONL or Parquet rows (read through groundup.data's one reader, so hostile lines
are skipped and counted like everywhere else):
- TRL conversational: `messages` = [{role, content}], an optional system message first;
- TRL prompt-completion: `prompt` and `completion`, each plain text or a list of messages;
- plain `text` (language-model fine-tuning on documents);
- ShareGPT: `conversations` = [{from: system|human|gpt, value}];
- Alpaca: `instruction`, optional `input`, `output`.
A record that fits none of them, or whose messages are malformed, is skipped and counted with its
`file:line` and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from groundup.data.readers import ReadStats, iter_records
from groundup.errors import DataError
from groundup.tokenizer.chat import ROLES

SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}
FORMATS = ("messages", "prompt-completion", "text", "sharegpt", "alpaca")


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


class BadRecord(ValueError):
    """A record that no accepted format describes (the reason is the message)."""


def parse_messages(value, key: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise BadRecord(f"'{key}' must be a non-empty list of {{role, content}} messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise BadRecord(f"{key}[{i}] is {type(m).__name__}, expected an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise BadRecord(f"{key}[{i}].role = {role!r}: expected one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise BadRecord(f"{key}[{i}].content must be a string, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def _check_turns(messages: list[dict], key: str) -> None:
    if messages[-1]["role"] != "assistant":
        raise BadRecord(f"'{key}' must end with an assistant message (what the model learns to say)")
    if any(m["role"] == "system" for m in messages[1:]):
        raise BadRecord(f"'{key}': a system message may only come first")


def to_example(record: dict) -> Example:
    """The record as an Example; BadRecord naming the problem when no format fits."""
    rid = str(record.get("id", ""))
    meta = {k: v for k, v in record.items() if not k.startswith("_") and k not in (
        "messages", "prompt", "completion", "conversations", "instruction", "input", "output")}
    if "messages" in record:
        messages = parse_messages(record["messages"], "messages")
        _check_turns(messages, "messages")
        return Example(rid, "messages", messages, completion_at=len(messages) - 1, meta=meta)
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
            return Example(rid, "prompt-completion", p + c, completion_at=len(p), meta=meta)
        raise BadRecord("'prompt' and 'completion' must both be strings or both be lists of messages")
    if "conversations" in record:
        turns = record["conversations"]
        if not isinstance(turns, list) or not turns:
            raise BadRecord("'conversations' must be a non-empty list of {from, value}")
        messages = []
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or t.get("from") not in SHAREGPT_ROLES or not isinstance(t.get("value"), str):
                raise BadRecord(f"conversations[{i}]: expected {{from: system|human|gpt, value: text}}")
            messages.append({"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]})
        _check_turns(messages, "conversations")
        return Example(rid, "sharegpt", messages, completion_at=len(messages) - 1, meta=meta)
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

