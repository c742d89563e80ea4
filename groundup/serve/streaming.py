"""Server-sent events exactly as OpenAI streams them.

    data: {chunk}\\n\\n ... data: [DONE]\\n\\n

Chat: the first chunk of each choice carries `delta: {"role": "assistant", "content": ""}`, then
`delta: {"content": ...}` chunks (with `logprobs.content` for their tokens when asked), then a chunk
with an empty delta and the `finish_reason`. With tools, text inside <tool_call> tags is held back and
each call goes out whole in one `delta: {"tool_calls": [{index, id, type, function: {name, arguments}}]}`
once its closing tag arrives, so `arguments` is never half a JSON string. Completions: `text` chunks (with `echo`, the prompt
text first), the last one with its `finish_reason`. With `stream_options.include_usage` every chunk
has `"usage": null` and a last chunk with empty `choices` carries the usage; with vLLM's
`continuous_usage_stats` every chunk carries the usage so far. A failure mid-stream is sent as
`data: {"error": {...}}` before `[DONE]`.

Text is what `TextStream` released: a stop string split across tokens is never sent, nor half of a
UTF-8 character. A token whose text is held back sends its log-prob with the next piece of text.
Events that arrive together (one decode step) leave as one write. When the client goes away the
request's rows leave the batch at the engine's next step, whether the stream was waiting for the engine
or for the socket (`stream`, Run.cancel_with).
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

from groundup.serve import responses as R
from groundup.serve.generation import Run, tool_finish_reason
from groundup.serve.protocol import APIError
from groundup.serve.scheduler import PromptEvent


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def stream(run: Run) -> AsyncIterator[str]:
    """The request's SSE body; `run` has been entered (its jobs submitted) and is exited when the body
    ends, or as soon as the task answering the request (the caller's) ends, however it ends: when the client
    goes away Starlette cancels the stream's writer, maybe before the body started or while it waits to
    write, and the body's own `finally` would then wait for the garbage collector."""
    run.cancel_with(asyncio.current_task())
    return _events(run)


async def _events(run: Run) -> AsyncIterator[str]:
    plan, tt = run.plan, run.server.text
    rid, created = R.new_id("chatcmpl" if plan.chat else "cmpl"), R.now()
    with_usage = plan.include_usage or plan.continuous_usage
    make = R.chat_chunk if plan.chat else R.completion_chunk

    def chunk(choices: list[dict]) -> str:
        use = run.usage() if plan.continuous_usage else None
        return sse(make(rid, created, plan.model, choices, use, with_usage))

    sent = {c.index: 0 for c in run.choices}  # text pieces already sent, per choice
    started: set[int] = set()  # choices whose first chunk has gone (echo's prompt text)
    offsets = {c.index: 0 for c in run.choices}  # completions' text_offset so far
    try:
        if plan.chat:
            yield "".join(chunk([R.chat_delta(c.index, {"role": "assistant", "content": ""})]) for c in run.choices)
        while run.remaining:
            try:
                events = await run.next_events()
            except APIError as e:
                yield sse(e.body())
                break
            touched: dict[int, None] = {}
            for ev in events:
                if isinstance(ev, PromptEvent):
                    touched.update(dict.fromkeys(range(ev.base_index, ev.base_index + plan.n)))
                elif hasattr(ev, "index"):
                    touched[ev.index] = None
            out = []
            for index in touched:
                c = run.choices[index]
                text = "".join(c.pieces[sent[index]:])
                sent[index] = len(c.pieces)
                log = c.pending.take()
                finished = c.finish_reason is not None
                if plan.chat:
                    lp = R.chat_logprobs(tt, log) if plan.logprobs is not None and len(log) else None
                    calls, reason = [], c.finish_reason
                    if c.calls is not None:  # content as it comes; each call once whole
                        text = c.calls.push(text) + (c.calls.finish() if finished else "")
                        calls = c.calls.new_calls
                        reason = tool_finish_reason(plan, reason, c.calls.calls)
                    if text or lp is not None:
                        out.append(chunk([R.chat_delta(index, {"content": text}, lp)]))
                    if calls:
                        first = len(c.calls.calls) - len(calls)
                        out.append(chunk([R.chat_delta(index, {"tool_calls": R.tool_call_deltas(calls, first)})]))
                    if finished:
                        out.append(chunk([R.chat_delta(index, {}, None, reason)]))
                    continue
                if plan.echo and index not in started:
                    text = plan.prompt_texts[index // plan.n] + text
                started.add(index)
                lp = None
                if plan.logprobs is not None and len(log):
                    lp = R.completion_logprobs(tt, log, offsets[index])
                    offsets[index] += sum(tt.shown_length(t) for t in log.tokens)
                if text or lp is not None or finished:
                    out.append(chunk([R.completion_choice(index, text, lp, c.finish_reason if finished else None)]))
            if out:
                yield "".join(out)
        else:
            if plan.include_usage:
                yield sse(make(rid, created, plan.model, [], run.usage(), True))
        yield "data: [DONE]\n\n"
    finally:
        await run.__aexit__(None, None, None)
