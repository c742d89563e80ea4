"""Response objects exactly as OpenAI shapes them: completions, chat completions, their stream chunks,
usage, and both log-prob structures.

Completions' `logprobs` (legacy): parallel lists `tokens`, `token_logprobs`, `top_logprobs` (a dict
token string -> log p per position: the k likeliest and, as vLLM adds it, the chosen token) and
`text_offset` (where each token starts in the returned `text`; special tokens add no text). With
`echo` the prompt's tokens come first, the first one's log-prob and top dict null. Chat's:
`{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.
Log-probs are the model's own distribution (before temperature and filters), as vLLM reports them.
"""

from __future__ import annotations

import time
import uuid

from groundup.serve.tokens import TokenText


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ChoiceLog:
    """Tokens of one choice with their log-probs, as they arrive (prompt tokens first with echo)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.logprobs: list[float | None] = []
        self.tops: list[list[tuple[int, float]] | None] = []

    def add(self, token: int, logprob: float | None, top: list | None) -> None:
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.tops.append(top)

    def take(self) -> "ChoiceLog":
        """What has arrived since the last take (a stream chunk's share), leaving this empty."""
        out = ChoiceLog()
        out.tokens, out.logprobs, out.tops = self.tokens, self.logprobs, self.tops
        self.tokens, self.logprobs, self.tops = [], [], []
        return out

    def __len__(self) -> int:
        return len(self.tokens)


def completion_logprobs(tt: TokenText, log: ChoiceLog, offset: int = 0) -> dict:
    """The legacy structure; `offset` is where the first token starts in the text."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for i, (t, lp, top) in enumerate(zip(log.tokens, log.logprobs, log.tops)):
        out["tokens"].append(tt.string(t))
        out["text_offset"].append(offset)
        offset += tt.shown_length(t)
        if lp is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(lp)
        ranked: dict[str, float] = {}
        for i, v in top or []:  # likeliest first: tokens that read the same (byte pieces: "\ufffd") keep the likeliest
            ranked.setdefault(tt.string(i), v)
        ranked.setdefault(tt.string(t), lp)
        out["top_logprobs"].append(ranked)
    return out


def chat_logprobs(tt: TokenText, log: ChoiceLog) -> dict:
    content = []
    for t, lp, top in zip(log.tokens, log.logprobs, log.tops):
        content.append({"token": tt.string(t), "logprob": lp, "bytes": tt.bytes(t),
                        "top_logprobs": [{"token": tt.string(i), "logprob": v, "bytes": tt.bytes(i)}
                                         for i, v in (top or [])]})
    return {"content": content, "refusal": None}


def completion_response(rid: str, created: int, model: str, choices: list[dict], use: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": None, "choices": choices, "usage": use}


def completion_choice(index: int, text: str, logprobs: dict | None, finish_reason: str | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_response(rid: str, created: int, model: str, choices: list[dict], use: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": None, "choices": choices, "usage": use}


def chat_choice(index: int, text: str, logprobs: dict | None, finish_reason: str | None,
                tool_calls: list[dict] | None = None) -> dict:
    message = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:  # OpenAI: content is null when the reply is only calls
        message["content"] = text.strip() or None
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def tool_call_deltas(calls: list, first_index: int) -> list[dict]:
    """Streamed `delta.tool_calls` entries: each call whole (its arguments are complete JSON)."""
    return [dict(index=first_index + k, **call.to_openai()) for k, call in enumerate(calls)]


def completion_chunk(rid: str, created: int, model: str, choices: list[dict], use: dict | None = None,
                     with_usage: bool = False) -> dict:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "system_fingerprint": None, "choices": choices}
    if with_usage:
        chunk["usage"] = use
    return chunk


def chat_chunk(rid: str, created: int, model: str, choices: list[dict], use: dict | None = None,
               with_usage: bool = False) -> dict:
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "system_fingerprint": None, "choices": choices}
    if with_usage:
        chunk["usage"] = use
    return chunk


def chat_delta(index: int, delta: dict, logprobs: dict | None = None, finish_reason: str | None = None) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
