"""Agent trajectories made into SFT records: every call answered, every session cut to fit the context.

    result = read_trajectories(["logs/", "more.jsonl"], tok, max_tokens=2048)
    result.records     # {"id", "messages", "tools"?, ...}: what `groundup sft` reads (one per piece)
    for record in iter_trajectories(paths, tok, 2048, result): ...   # the same, streamed (records stay empty)
    result.dropped     # {reason: count}; result.examples[reason]: the first "file:line: detail" of each
    result.sessions, result.split, result.pieces   # sessions kept, sessions split, pieces they became

Input: agent logs in OpenAI's messages format: JSONL with one conversation a line, or folders of `.json`
files with one session each (an object with `messages` and optional `tools`, or the bare messages list).

Checks, as OpenAI's API makes them: an assistant message's `tool_calls` are answered by the `tool`
messages right after it, one per call id, before anything else is said. A session is dropped, counted by
reason with its file:line, when a call has no result (`missing_result`), a result answers no pending call
(`orphan_result`), it is not a chat the tokenizer can render (`malformed`: a bad role or content, a call
without id or name, arguments that are not JSON, a system message after the first), it has no assistant
turn (`no_assistant`), or one turn alone does not fit (`too_long`). Unreadable lines are `bad_json`.
OpenAI's list-of-parts content (`[{"type": "text", "text": ...}]`) is read as its text. User turns after the
last assistant message teach nothing and are left off.

Splitting: a session longer than `max_tokens` (its ids as the tokenizer's render_chat(messages, tools=...)
writes them) is cut at turn boundaries into pieces that each fit. A turn is an assistant message with the
results of its calls, together with the user message before it, if any: so a piece never separates a call
from its result, and ends either with an assistant reply or with the results of the last call (masked,
like every result). Each piece starts with the session's head (the system message, the tool definitions,
and the first user message: the task) and takes as many whole turns as fit; every assistant message is
in exactly one piece, so the assistant tokens trained on, and the loss mask over them, are the session's.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from groundup.data.readers import ReadStats, check_inputs, iter_input_files, read_input_file
from groundup.errors import DataError

REASONS = ("bad_json", "malformed", "missing_result", "orphan_result", "no_assistant", "too_long")
MAX_EXAMPLES = 10  # file:line positions kept per reason
MAX_FILE_BYTES = 64 << 20  # a .json session larger than this is not read into memory


class BadTrajectory(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass
class Trajectories:
    records: list[dict] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    sessions: int = 0  # kept
    split: int = 0  # of those, cut into pieces
    pieces: int = 0  # the pieces the split sessions became
    written: int = 0  # records given out (one per piece)
    files_skipped: int = 0  # files not read (not JSON, binary, unreadable)
    files_skipped_examples: list[str] = field(default_factory=list)  # the first few, "path: why"

    def drop(self, reason: str, where: str, detail: str) -> None:
        self.dropped[reason] += 1
        kept = self.examples.setdefault(reason, [])
        if len(kept) < MAX_EXAMPLES:
            kept.append(f"{where}: {detail}")

    def summary(self, max_tokens: int) -> str:
        dropped = sum(self.dropped.values())
        reasons = ", ".join(f"{r} {self.dropped[r]:,}" for r in REASONS if self.dropped[r])
        cut = (f"; {self.split:,} longer than --max-tokens {max_tokens:,} split into {self.pieces:,} pieces"
               if max_tokens else "")
        skipped = f"; {self.files_skipped:,} files not read" if self.files_skipped else ""
        return (f"{self.written:,} records from {self.sessions:,} sessions{cut}; {dropped:,} dropped"
                + (f" ({reasons})" if reasons else "") + skipped)


def _text(content, where: str):
    """Content as a string (OpenAI's list of text parts joined), or None where it is None."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BadTrajectory("malformed", f"{where}.content: expected a string or a list of text parts")


def check_session(messages, tools) -> list[dict]:
    """The session's messages (content parts joined, user turns after the last reply left off), once every
    call has its result and every result answers a call; BadTrajectory naming the reason otherwise."""
    if not isinstance(messages, list) or not messages:
        raise BadTrajectory("malformed", "'messages' must be a non-empty list")
    if tools is not None and not isinstance(tools, list):
        raise BadTrajectory("malformed", "'tools' must be a list of tool definitions")
    out: list[dict] = []
    pending: dict[str, str] = {}  # call id -> tool name, waiting for its result
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadTrajectory("malformed", f"{where}: expected a message with role system, user, assistant or tool")
        m = {**m, "content": _text(m.get("content"), where)}
        role = m["role"]
        if role == "tool":
            cid = m.get("tool_call_id")
            if cid not in pending:
                answered = "no pending call" if not pending else f"the pending calls are {', '.join(pending)}"
                raise BadTrajectory("orphan_result", f"{where}: result for call {cid!r} answers none ({answered})")
            del pending[cid]
            if m["content"] is None:
                raise BadTrajectory("malformed", f"{where}.content: a tool result must be a string")
        elif pending:
            raise BadTrajectory("missing_result", f"{where}: {role} message before the result of call "
                                f"{next(iter(pending))!r} ({pending[next(iter(pending))]})")
        if role == "system" and i:
            raise BadTrajectory("malformed", f"{where}: a system message may only come first")
        calls = m.get("tool_calls")
        if calls is not None and role != "assistant":
            raise BadTrajectory("malformed", f"{where}: only an assistant message has tool_calls")
        if role == "assistant" and calls:
            if not isinstance(calls, list):
                raise BadTrajectory("malformed", f"{where}.tool_calls: expected a list")
            for k, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                cid = call.get("id") if isinstance(call, dict) else None
                if not (isinstance(cid, str) and cid and isinstance(fn, dict) and isinstance(fn.get("name"), str)):
                    raise BadTrajectory("malformed", f"{where}.tool_calls[{k}]: expected {{id, function: {{name, "
                                        "arguments}}}}")
                if cid in pending:
                    raise BadTrajectory("malformed", f"{where}.tool_calls[{k}]: call id {cid!r} used twice")
                pending[cid] = fn["name"]
        elif m["content"] is None and role != "tool":
            raise BadTrajectory("malformed", f"{where}.content: a string is needed without tool_calls")
        out.append(m)
    if pending:
        cid = next(iter(pending))
        raise BadTrajectory("missing_result", f"call {cid!r} ({pending[cid]}) has no result: the session ends first")
    last = max((i for i, m in enumerate(out) if m["role"] == "assistant"), default=None)
    if last is None:
        raise BadTrajectory("no_assistant", "no assistant message: nothing to learn")
    while out[-1]["role"] == "user":  # a question never answered
        out.pop()
    return out


def session_turns(messages: list[dict]) -> tuple[list[dict], list[list[dict]]]:
    """(head, turns): the head is the system message and the first user message, where they lead; each turn
    an assistant message with its results, and the user message before it (see the module docstring)."""
    n = 1 if messages[0]["role"] == "system" else 0
    if n < len(messages) and messages[n]["role"] == "user":
        n += 1
    turns: list[list[dict]] = []
    waiting: list[dict] = []  # user messages that belong to the next assistant turn
    for m in messages[n:]:
        if m["role"] == "user":
            waiting.append(m)
        elif m["role"] == "assistant":
            turns.append([*waiting, m])
            waiting = []
        else:
            turns[-1].append(m)  # a result: check_session put it right after its call
    return messages[:n], turns


def _length(tok, messages: list[dict], tools) -> int:
    return len(tok.render_chat(messages, tools=tools)[0])


def split_session(tok, messages: list[dict], tools: list | None, max_tokens: int) -> list[list[dict]]:
    """The session as pieces of at most `max_tokens` (see the module docstring); BadTrajectory("too_long")
    when the head with one turn does not fit."""
    if _length(tok, messages, tools) <= max_tokens or not max_tokens:  # rendered even unlimited: a check
        return [messages]
    head, turns = session_turns(messages)
    base = _length(tok, head, tools) if head else 0
    if base > max_tokens:
        raise BadTrajectory("too_long", f"the system message, tools and task alone are {base:,} tokens")
    # Each turn's cost as rendered after the head: turns are encoded each on its own, so a piece's length is
    # the head's plus its turns' (checked below with a real render, in case a template does otherwise).
    cost = [_length(tok, head + turn, tools) - base for turn in turns]
    pieces, i = [], 0
    while i < len(turns):
        j, used = i, base
        while j < len(turns) and used + cost[j] <= max_tokens:
            used += cost[j]
            j += 1
        while j > i and _length(tok, head + [m for t in turns[i:j] for m in t], tools) > max_tokens:
            j -= 1
        if j == i:
            size = _length(tok, head + turns[i], tools)
            raise BadTrajectory("too_long", f"the turn from message {messages.index(turns[i][0])} ({len(turns[i])} "
                                f"messages) is {size:,} tokens with the head, over {max_tokens:,}")
        pieces.append(head + [m for t in turns[i:j] for m in t])
        i = j
    return pieces


def _read_json_session(path: Path, res: Trajectories) -> Iterator[dict]:
    where = str(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            res.drop("too_long", where, f"a session file over {MAX_FILE_BYTES >> 20} MB")
            return
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        res.drop("bad_json", where, f"unreadable JSON session: {type(e).__name__}: {str(e)[:120]}")
        return
    if isinstance(value, list):
        value = {"messages": value}
    if not isinstance(value, dict):
        res.drop("bad_json", where, f"expected an object with messages, got {type(value).__name__}")
        return
    yield {**value, "_where": where}


def iter_sessions(paths: Sequence[str | Path], res: Trajectories, stats: ReadStats) -> Iterator[dict]:
    """Each session record with its `_where`: JSONL lines (read by groundup.data, whose problems `stats`
    counts) and whole `.json` files."""
    check_inputs(paths)
    for file in iter_input_files(paths):
        if file.path.suffix.lower() == ".json":
            yield from _read_json_session(file.path, res)
        else:
            yield from read_input_file(file, stats, require_text=False)


def read_trajectories(paths: Sequence[str | Path], tok, max_tokens: int = 0) -> Trajectories:
    """Every session of the inputs checked and, over `max_tokens` (0: never), split (module docstring)."""
    res = Trajectories()
    res.records = list(iter_trajectories(paths, tok, max_tokens, res))
    return res


def iter_trajectories(paths: Sequence[str | Path], tok, max_tokens: int, res: Trajectories) -> Iterator[dict]:
    """read_trajectories' records one at a time, counting in `res`; DataError at the end when the inputs held
    no session at all."""
    stats, written = ReadStats(), 0
    for record in iter_sessions(paths, res, stats):
        where = record.pop("_where", "?")
        fields = {k: v for k, v in record.items() if not k.startswith("_") and k not in ("messages", "tools")}
        tools = record.get("tools") or None
        try:
            messages = check_session(record.get("messages"), tools)
            try:
                pieces = split_session(tok, messages, tools, max_tokens)  # renders the whole session first
            except BadTrajectory:
                raise
            except Exception as e:  # noqa: BLE001  untrusted input meets the renderer (or a Jinja template)
                raise BadTrajectory("malformed", f"cannot be rendered: {type(e).__name__}: {str(e)[:160]}") from None
        except BadTrajectory as e:
            res.drop(e.reason, where, str(e))
            continue
        res.sessions += 1
        if len(pieces) > 1:
            res.split += 1
            res.pieces += len(pieces)
        base = str(fields.pop("id", "") or where)
        for k, piece in enumerate(pieces):
            record = {"id": base if len(pieces) == 1 else f"{base}#{k}", **fields, "messages": piece,
                      **({"tools": tools} if tools else {}), "origin": where}
            written += 1
            yield record if len(pieces) == 1 else {**record, "piece": k, "pieces": len(pieces)}
    for kind in ("bad_json", "too_long"):  # the reader's own problems with lines count as dropped sessions
        for example in getattr(stats, f"{kind}_examples"):
            res.examples.setdefault(kind, []).append(example)
        res.dropped[kind] += getattr(stats, kind)
    res.files_skipped = stats.unsupported_files + stats.unreadable_files + stats.binary_files
    res.files_skipped_examples = stats.unsupported_examples + stats.unreadable_examples + stats.binary_examples
    res.written += written
    if not written and not sum(res.dropped.values()):
        raise DataError(f"no sessions found in {', '.join(map(str, paths))}: {stats.summary()}")
