"""`serve --execute-tools`: the server runs the built-in tools it was told to, and answers with the final message.

OpenAI's contract stays the default: a reply's `tool_calls` go back to the client, which runs them. With
`--execute-tools calculator,python`, a non-streamed chat request (tool_choice other than "none") gets those
tools' definitions added to its `tools` (a client tool of the same name is the client's), and while the
model's reply calls no tool the client defined, each call runs here (groundup/tools: time and size limits;
a tool that raises, times out, does not exist or gets arguments that are not JSON is an error result the
model reads, never a 500), the call message and one `tool` message per result are appended, and the model is asked
again (tool_choice required or named forces the first reply only; later rounds are "auto"). After
`max_tool_calls` executed calls, the model is asked once more with tool_choice "none", so
the answer is text. The response is OpenAI's for the last round: usage summed over the rounds, and the
turns run here in `tool_messages` (a groundup field; the `openai` client keeps it as an extra). A reply that
calls a tool the client defined goes back to the client as it is, with the turns run so far. Only choice 0
is continued, so such a request needs n = 1. A streamed request keeps OpenAI's contract unchanged (its
calls go to the client): this loop answers once the last round is done, which a stream cannot wait for.

/metrics counts each executed call: groundup_tool_calls_total{tool, outcome} (outcome ok or error; a name
the server does not run is counted as tool "unknown", so a model's inventions cannot grow the label set).
"""

from __future__ import annotations

import asyncio
import json

from fastapi.responses import Response

from groundup.serve import responses as R
from groundup.serve.generation import ClientGone, Run, collect, plan_chat
from groundup.serve.protocol import APIError, ChatCompletionRequest, ChatMessage, Tool, ToolCallMessage
from groundup.tokenizer.tool_calls import ToolCall


def executes(server, req: ChatCompletionRequest) -> bool:
    """Whether this request runs through the server-side loop."""
    return server.tool_runner is not None and not req.stream and req.tool_choice != "none"


async def _round(server, req: ChatCompletionRequest, request) -> dict | Response:
    run = Run(server, plan_chat(server, req), request)
    await run.__aenter__()
    try:
        return await collect(run)
    except ClientGone:  # nobody to answer; the status is for /metrics (nginx's "client closed request")
        return Response(status_code=499)
    finally:
        await run.__aexit__(None, None, None)


def _written(call: dict) -> ToolCallMessage:
    """A call as the next round's prompt writes it. Arguments that are not a JSON object are written as {}:
    a template can only write JSON there (a client sending them back gets a 400), and the error result that
    follows quotes what the model wrote."""
    arguments = call["function"]["arguments"]
    try:
        if not isinstance(json.loads(arguments), dict):
            arguments = "{}"
    except json.JSONDecodeError:
        arguments = "{}"
    return ToolCallMessage(id=call["id"], function={"name": call["function"]["name"], "arguments": arguments})


async def answer(server, req: ChatCompletionRequest, request) -> dict | Response:
    """The final response of the server-side loop (see the module docstring)."""
    if req.n != 1:
        raise APIError(400, f"n = {req.n}: with --execute-tools the server continues one conversation per "
                            "request; ask for n = 1 (or tool_choice none)", param="n")
    runner = server.tool_runner
    theirs = {t.function.name for t in req.tools or []}
    ours = [Tool.model_validate(s) for s in runner.schemas() if s["function"]["name"] not in theirs]
    names = {t.function.name for t in ours}
    req = req.model_copy(update={"tools": [*(req.tools or []), *ours]})
    messages, added, used, executed = list(req.messages), [], {"prompt_tokens": 0, "completion_tokens": 0}, 0
    while True:
        body = await _round(server, req.model_copy(update={"messages": messages}), request)
        if isinstance(body, Response):
            return body
        for key in used:
            used[key] += body["usage"][key]
        message = body["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if not calls or req.tool_choice == "none" or any(c["function"]["name"] in theirs for c in calls):
            break  # an answer, or a call the client runs (a name no one defined runs here: an error result)
        if executed + len(calls) > server.max_tool_calls:  # the budget is spent: one last round, in text
            req = req.model_copy(update={"tool_choice": "none"})
            continue
        messages.append(ChatMessage(role="assistant", content=message.get("content"),
                                    tool_calls=[_written(c) for c in calls]))
        added.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
        for c in calls:
            call = ToolCall(c["function"]["name"], c["function"]["arguments"], c["id"])
            result = await asyncio.to_thread(runner.run, call)  # a sandboxed python run must not stall the loop
            server.metrics.tool_call(call.name if call.name in names else "unknown", result.ok)
            messages.append(ChatMessage(role="tool", tool_call_id=call.id, content=result.content))  # "Error: ..."
            added.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.content})
        executed += len(calls)
        if req.forces_tool_call:  # required or named: the first reply is a call; the next ones may answer
            req = req.model_copy(update={"tool_choice": "auto"})
    body["usage"] = R.usage(used["prompt_tokens"], used["completion_tokens"])
    body["tool_messages"] = added
    return body
