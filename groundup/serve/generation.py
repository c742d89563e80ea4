"""From a validated request to scheduler jobs, and from their events to one OpenAI response.

    plan = plan_completion(server, req)      # or plan_chat: prompts encoded, limits checked, jobs made
    async with Run(server, plan, request) as run:
        body = await collect(run)            # non-streaming; streaming.py streams the same events

Limits, each a 400 (404 for an unknown model) before anything runs: a prompt that leaves no room in
the context, prompt + max_tokens over the context (vLLM's message), max_tokens over the server's
limit, `n` over the server's limit, too many prompts, token ids outside the vocabulary. With no
max_tokens, completions generate min(16, room) tokens (OpenAI's default) and chats whatever the
context leaves, up to the server's limit. With tools, the chat template writes their definitions, the
reply's tool calls are parsed into `tool_calls` (finish_reason "tool_calls"), and tool_choice required or
a named function constrains decoding to valid calls (infer/structured.py's Structured.tool_calls). Each prompt is one Job of `n` choices; choice indices are
prompt * n + choice. A request whose client goes away is cancelled: its rows leave the batch.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from groundup.errors import ConfigError
from groundup.infer.sampling import SamplingConfig
from groundup.infer.structured import Structured
from groundup.serve import responses as R
from groundup.serve.protocol import APIError, ChatCompletionRequest, CompletionRequest
from groundup.serve.responses import ChoiceLog
from groundup.serve.scheduler import AdapterGone, Busy, ErrorEvent, Job, PromptEvent, make_job
from groundup.tokenizer.tool_calls import ToolCallStream, parse_tool_calls


@dataclass
class Plan:
    chat: bool
    model: str
    jobs: list[Job]
    n: int
    stream: bool
    echo: bool = False
    prompt_texts: list[str] = field(default_factory=list)  # echo: each prompt as text
    logprobs: int | None = None  # None: no log-probs; else top-k per position
    include_usage: bool = False
    continuous_usage: bool = False
    tool_mode: str = "none"  # chat: none (text only), auto, required or named (tool calls parsed from the text)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(j.prompt) for j in self.jobs)

    @property
    def choices(self) -> int:
        return len(self.jobs) * self.n


def _max_new(server, prompt_len: int, requested: int | None, default: int | None, param: str, echo_only_ok: bool) -> int:
    ctx = server.context
    if requested is not None and requested > server.max_tokens:
        raise APIError(400, f"{param} = {requested} is over this server's limit of {server.max_tokens}", param=param)
    if requested == 0 and echo_only_ok:
        if prompt_len > ctx:
            raise APIError(400, f"This model's maximum context length is {ctx} tokens. However, your prompt is "
                                f"{prompt_len} tokens.", param="prompt", code="context_length_exceeded")
        return 0
    if prompt_len >= ctx:
        raise APIError(400, f"This model's maximum context length is {ctx} tokens. However, your prompt is "
                            f"{prompt_len} tokens, which leaves no room for a completion. Please shorten it.",
                       param="messages" if param == "max_completion_tokens" else "prompt",
                       code="context_length_exceeded")
    if requested is None:
        return min(default or server.max_tokens, server.max_tokens, ctx - prompt_len)
    if requested < 1:
        raise APIError(400, f"{param} = 0: nothing to generate (0 is allowed only with echo)", param=param)
    if prompt_len + requested > ctx:
        raise APIError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                            f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} in the "
                            "completion). Please reduce the length of the prompt or completion.", param=param,
                       code="context_length_exceeded")
    return requested


def _structured(req):
    """The request's structured output, compiled once here so that a bad schema, regex or grammar is a 400."""
    try:
        spec = req.structured()
        if spec is not None:
            spec.validate()
    except ConfigError as e:
        param = next(iter(req.structured_options()), None)
        raise APIError(400, str(e), param=param, code="invalid_value") from None
    return spec


def _sampling(req, max_new: int, logprobs: int | None, structured=None, skip_special: bool = True) -> SamplingConfig:
    seed = req.seed if req.seed is not None else random.getrandbits(62)
    top_k = req.top_k if req.top_k and req.top_k > 0 else 0
    return SamplingConfig.make(
        max_new_tokens=max(max_new, 1), temperature=1.0 if req.temperature is None else req.temperature, top_k=top_k,
        top_p=1.0 if req.top_p is None else req.top_p, min_p=req.min_p or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty, seed=seed,
        stop=list(req.stop or []), logprobs=logprobs is not None, top_logprobs=logprobs or 0,
        structured=structured if structured is not None else _structured(req), skip_special_tokens=skip_special)


def _check_n(server, n: int) -> None:
    if n > server.max_n:
        raise APIError(400, f"n = {n} is over this server's limit of {server.max_n}", param="n")


def _stream_flags(req) -> tuple[bool, bool]:
    opts = req.stream_options
    return bool(opts and opts.include_usage), bool(opts and opts.continuous_usage_stats)


def plan_completion(server, req: CompletionRequest) -> Plan:
    name, adapter = server.adapter_index(req.model)
    _check_n(server, req.n)
    p = req.prompt
    if isinstance(p, str):
        items = [p]
    elif isinstance(p[0], int):
        items = [p]
    else:
        items = list(p)
    if len(items) > server.limits.max_prompts:
        raise APIError(400, f"prompt: {len(items)} prompts, over this server's limit of {server.limits.max_prompts}",
                       param="prompt")
    tt = server.text
    prompts, texts = [], []
    for i, item in enumerate(items):
        if isinstance(item, str):
            ids, text = tt.encode(item), item
        else:
            if not item:
                raise APIError(400, f"prompt[{i}] is an empty list of token ids", param="prompt")
            ids = tt.check_ids(item, "prompt")
            text = server.tokenizer.decode(ids, skip_special_tokens=True)
        prompts.append(ids)
        texts.append(text)
    echo_only = req.echo and req.max_tokens == 0
    k = req.logprobs
    include_usage, continuous = _stream_flags(req)
    jobs = []
    for i, ids in enumerate(prompts):
        max_new = _max_new(server, len(ids), req.max_tokens, 16, "max_tokens", echo_only_ok=req.echo)
        jobs.append(make_job(ids, _sampling(req, max_new, k), n=req.n, adapter=adapter,
                        prompt_logprobs=k if (req.echo and k is not None) else None, generate=not echo_only,
                        base_index=i * req.n, ignore_eos=req.ignore_eos))
    return Plan(False, name, jobs, req.n, req.stream, echo=req.echo, prompt_texts=texts, logprobs=k,
                include_usage=include_usage, continuous_usage=continuous)


def plan_chat(server, req: ChatCompletionRequest) -> Plan:
    name, adapter = server.adapter_index(req.model)
    _check_n(server, req.n)
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    ids = server.text.chat(req.messages, tools=tools)
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_new = _max_new(server, len(ids), req.token_limit, None, param, echo_only_ok=False)
    k = (req.top_logprobs or 0) if req.logprobs else None
    include_usage, continuous = _stream_flags(req)
    mode, tags, grammar = req.tool_mode, server.text.tool_tag_ids(), None
    if req.forces_tool_call:  # decoding is constrained to valid calls of the allowed functions
        function = req.tool_choice.function.name if mode == "named" else None
        grammar = Structured.tool_calls(tools, function, parallel=req.parallel_tool_calls is not False, tag_ids=tags)
    sampling = _sampling(req, max_new, k, grammar, skip_special=not (mode != "none" and tags))
    job = make_job(ids, sampling, n=req.n, adapter=adapter, ignore_eos=req.ignore_eos)
    return Plan(True, name, [job], req.n, req.stream, logprobs=k, include_usage=include_usage,
                continuous_usage=continuous, tool_mode=mode)


def tool_finish_reason(plan: Plan, reason: str | None, calls: list) -> str | None:
    """OpenAI's: "tool_calls" when the model chose to call (auto, required); a named choice stops as usual."""
    return "tool_calls" if calls and reason == "stop" and plan.tool_mode in ("auto", "required") else reason


class ClientGone(Exception):
    """The client of a non-streaming request disconnected while it waited."""


class Choice:
    """One choice as it arrives: text pieces, tokens with their log-probs, how it ended; with tools, the
    calls read out of the text (`calls`: tokenizer/tool_calls.py's ToolCallStream)."""

    def __init__(self, index: int, tools: bool = False):
        self.index = index
        self.calls = ToolCallStream() if tools else None
        self.pieces: list[str] = []
        self.log = ChoiceLog()  # every token reported (echoed prompt first)
        self.pending = ChoiceLog()  # tokens not yet sent in a stream chunk
        self.generated = 0
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


_GONE = object()  # queued by Run's watcher: the client went away


class Run:
    """One request's jobs in the scheduler: submitted on entry, cancelled on exit if unfinished, and
    cancelled the moment the client goes away, so the engine drops them at its next step. With `request`
    (non-streaming: the body has been read), a watcher awaits the ASGI disconnect message. A stream's
    disconnect is Starlette's to notice: it then ends the task answering the request (`cancel_with`)."""

    def __init__(self, server, plan: Plan, request=None):
        self.server, self.plan, self.request = server, plan, request
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices = [Choice(i, plan.tool_mode != "none") for i in range(plan.choices)]
        self.remaining = plan.choices
        self.prompt_logs: dict[int, PromptEvent] = {}  # base index -> the job's prompt log-probs
        self.watcher: asyncio.Task | None = None

    async def __aenter__(self) -> "Run":
        try:
            for job in self.plan.jobs:
                self.server.scheduler.submit(job, self.queue)
        except Busy as e:
            self._cancel()
            raise APIError(503, f"the server is busy: {e}; retry later", type="server_error", code="server_busy") from None
        except AdapterGone:  # unloaded between this request naming it and its jobs reaching the scheduler
            self._cancel()
            raise APIError(404, f"The model `{self.plan.model}` does not exist (it was just unloaded)", param="model",
                           code="model_not_found") from None
        if self.request is not None:
            self.watcher = asyncio.ensure_future(self._watch())
        return self

    async def __aexit__(self, *exc) -> None:
        self._cancel()
        if self.watcher is not None:
            self.watcher.cancel()

    async def _watch(self) -> None:
        """Non-streaming: the body is read, so the next message is `http.disconnect` once the client goes
        away (the response is sent after the exit, which stops this)."""
        try:
            while (await self.request.receive())["type"] != "http.disconnect":
                await asyncio.sleep(0.05)  # not the ASGI servers we know: do not spin
        except Exception:  # noqa: BLE001 - a server whose receive fails: leave the request be
            return
        self._cancel()
        self.queue.put_nowait(_GONE)

    def cancel_with(self, task: asyncio.Task | None) -> None:
        """Cancel the jobs as soon as `task` (the one answering the request) ends, however it ends."""
        if task is not None:
            task.add_done_callback(lambda _: self._cancel())

    def _cancel(self) -> None:
        for job in self.plan.jobs:
            self.server.scheduler.cancel(job)

    @property
    def completion_tokens(self) -> int:
        return sum(c.generated for c in self.choices)

    def usage(self) -> dict:
        return R.usage(self.plan.prompt_tokens, self.completion_tokens)

    async def next_events(self) -> list:
        """The events that have arrived (at least one), applied to the choices. With a request,
        a client that went away raises ClientGone (its jobs are cancelled already)."""
        events = [await self.queue.get()]
        while not self.queue.empty():
            events.append(self.queue.get_nowait())
        if any(ev is _GONE for ev in events):
            raise ClientGone()
        for ev in events:
            self._apply(ev)
        return events

    def _apply(self, ev) -> None:
        if isinstance(ev, ErrorEvent):
            raise APIError(500, ev.message, type="server_error", code="internal_error")
        if isinstance(ev, PromptEvent):
            self.prompt_logs[ev.base_index] = ev
            job = next(j for j in self.plan.jobs if j.base_index == ev.base_index)
            for i in range(self.plan.n):
                c = self.choices[ev.base_index + i]
                for t, lp, top in zip(job.prompt, ev.logprobs, ev.top or [None] * len(job.prompt)):
                    c.log.add(t, lp, top)
                    c.pending.add(t, lp, top)
            return
        c = self.choices[ev.index]
        if ev.token is not None:
            c.generated += 1
            if self.plan.logprobs is not None:
                c.log.add(ev.token, ev.logprob, ev.top)
                c.pending.add(ev.token, ev.logprob, ev.top)
        if ev.text:
            c.pieces.append(ev.text)
        if ev.finish_reason is not None:
            c.finish_reason = ev.finish_reason
            self.remaining -= 1


async def collect(run: Run) -> dict:
    """The whole response once every choice has finished."""
    while run.remaining:
        await run.next_events()
    plan, tt = run.plan, run.server.text
    rid, created = R.new_id("chatcmpl" if plan.chat else "cmpl"), R.now()
    choices = []
    for c in run.choices:
        if plan.chat:
            lp = R.chat_logprobs(tt, c.log) if plan.logprobs is not None else None
            text, calls = (c.text, []) if c.calls is None else parse_tool_calls(c.text)
            reason = tool_finish_reason(plan, c.finish_reason, calls)
            choices.append(R.chat_choice(c.index, text, lp, reason, [call.to_openai() for call in calls]))
        else:
            prefix = plan.prompt_texts[c.index // plan.n] if plan.echo else ""
            lp = R.completion_logprobs(tt, c.log) if plan.logprobs is not None else None
            choices.append(R.completion_choice(c.index, prefix + c.text, lp, c.finish_reason))
    build = R.chat_response if plan.chat else R.completion_response
    return build(rid, created, plan.model, choices, run.usage())
