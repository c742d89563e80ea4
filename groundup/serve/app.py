"""The HTTP routes: an OpenAI-compatible API (plus vLLM's tokenizer endpoints), metrics and the chat page.

    GET  /                       the chat page (page.html: self-contained, nothing fetched from outside)
    GET  /health                 200 {"status": "ok", ...} once the decode loop runs (503 while starting
                                 or stopped; never needs the key)
    GET  /v1/models[/{id}]       the base model and each adapter
    POST /v1/completions         prompt(s) -> text; echo + logprobs give the prompt's log-probs
    POST /v1/chat/completions    messages -> the assistant's reply (the tokenizer's chat format); with
                                 --execute-tools the server runs its built-in tools first (tool_exec.py)
    POST /tokenize, /detokenize  GET /tokenizer_info   (vLLM's; lm-evaluation-harness uses them)
    POST /v1/load_lora_adapter, /v1/unload_lora_adapter   (vLLM's; with --allow-adapter-updates:
                                 adapter_updates.py)
    GET  /arena                  whether blind battles are on ({"enabled", "ready", "models", "message"})
    POST /arena/battle, /arena/answer, /arena/vote   blind battles between two served models, voted by people
                                 (with --arena-log FILE: votes.py; the chat page's "Blind battle" mode)
    GET  /metrics                Prometheus text
    GET  /openapi.json           the API's OpenAPI schema, request bodies included (protocol.py's models)

Every failure is a JSON error object `{"error": {"message", "type", "param", "code"}}` with a 4xx
or 5xx status, and the server goes on: 400 (bad JSON, fields, limits, context), 401 (with
`--api-key`: a missing or wrong `Authorization: Bearer KEY` on anything but `/` and `/health`),
404 (unknown model, path or battle), 405, 409 (unloading an adapter in use; a battle voted or answered twice, or
with fewer than two models), 413 (a body over the limit), 503 (queue
full, shutting down),
500 (a bug, logged). A client that goes away before its body has arrived is no error: nothing is logged, and
/metrics counts it under 499 (nginx's "client closed request"). tests/test_serve_fuzz.py holds all this
against requests generated from /openapi.json. `create_app` starts the scheduler with the app's lifespan
and stops it after uvicorn has let in-flight requests finish (its graceful-shutdown period).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from groundup.serve.adapter_updates import HOW_TO_ENABLE, LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from groundup.serve.generation import ClientGone, Run, collect, plan_chat, plan_completion
from groundup.serve.page import HEADERS as PAGE_HEADERS, page_html
from groundup.serve.protocol import (APIError, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                     TokenizeRequest, parse, request_schemas)
from groundup.serve.server import Server
from groundup.serve.streaming import stream
from groundup.serve.tool_exec import answer as execute_tools, executes
from groundup.serve.votes import HOW_TO_ENABLE as ARENA_HOW_TO_ENABLE, AnswerRequest, BattleRequest, VoteRequest

log = logging.getLogger("groundup.serve")

OPEN_PATHS = {"/", "/health", "/favicon.ico"}
KNOWN_PATHS = {"/", "/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
               "/tokenizer_info", "/metrics", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/openapi.json",
               "/arena", "/arena/battle", "/arena/answer", "/arena/vote"}
BODIES = (CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest, LoadLoRAAdapterRequest,
          UnloadLoRAAdapterRequest, BattleRequest, AnswerRequest, VoteRequest)


def body_schema(model) -> dict:
    """A route's OpenAPI request body: the routes read and validate their bodies themselves (parse), so that
    every fault is OpenAI's 400 and the body limit holds; this tells the schema what they accept."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def error_response(e: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to exceed `limit` bytes (Content-Length or counted)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body is {declared} bytes, over this server's limit of {limit}",
                       code="request_too_large")
    chunks, size = [], 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise APIError(413, f"the request body is over this server's limit of {limit} bytes", code="request_too_large")
        chunks.append(piece)
    return b"".join(chunks)


class Guard:
    """Outermost: the API key check, and per request its status and duration for /metrics (a
    stream's duration runs to its last byte)."""

    def __init__(self, app, server: Server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, path, status = time.perf_counter(), scope["path"], [500]
        key = self.server.api_key
        if key is not None and path not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            token = given[7:] if given[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(token, key.encode()):
                response = error_response(APIError(401, "Incorrect or missing API key: send Authorization: Bearer KEY",
                                                   code="invalid_api_key"))
                await response(scope, receive, send)
                self.server.metrics.request(_label(path), 401, time.perf_counter() - start)
                return

        async def watched(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            self.server.metrics.request(_label(path), status[0], time.perf_counter() - start)


def create_app(server: Server) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.start()
        try:
            yield
        finally:
            server.stop()

    app = FastAPI(title="groundup", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server
    limit = server.limits.max_body_bytes

    app.add_middleware(Guard, server=server)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        message = f"{request.method} {request.url.path}: {e.detail}"
        return error_response(APIError(e.status_code, message, code=kind))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, e: ClientDisconnect):
        return Response(status_code=499)  # nobody to answer: the status is for /metrics

    @app.exception_handler(Exception)
    async def bug(request: Request, e: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return error_response(APIError(500, f"internal error: {type(e).__name__}", type="server_error",
                                       code="internal_error"))

    async def respond(plan, request: Request, keep=None) -> Response:
        run = Run(server, plan, None if plan.stream else request)
        await run.__aenter__()
        if keep is not None:  # a battle's answer keeps its run: the text it logs is the text sent
            keep(run)
        if plan.stream:
            return StreamingResponse(stream(run), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            body = await collect(run)
        except ClientGone:  # nobody to answer; the status is for /metrics (nginx's "client closed request")
            return Response(status_code=499)
        finally:
            await run.__aexit__(None, None, None)
        return JSONResponse(body)

    @app.get("/", include_in_schema=False)
    async def page():
        return HTMLResponse(page_html(), headers=PAGE_HEADERS)

    @app.get("/health")
    async def health():
        sched = server.scheduler
        state = "stopped" if not sched.thread.is_alive() else "ok" if sched.ready else "starting"
        body = {"status": state, "running": sched.running, "waiting": sched.queued}
        return JSONResponse(body, status_code=200 if state == "ok" else 503)

    @app.get("/v1/models")
    async def models():
        return server.models()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        name, _ = server.adapter_index(model_id)
        card = next((m for m in server.models()["data"] if m["id"] == name), None)
        if card is None:  # unloaded meanwhile
            raise APIError(404, f"The model `{model_id}` does not exist", param="model", code="model_not_found")
        return card

    @app.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
    async def completions(request: Request):
        req = parse(CompletionRequest, await read_body(request, limit))
        return await respond(plan_completion(server, req), request)

    @app.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request):
        req = parse(ChatCompletionRequest, await read_body(request, limit))
        if executes(server, req):  # serve --execute-tools: the server runs its tools and answers at the end
            body = await execute_tools(server, req, request)
            return body if isinstance(body, Response) else JSONResponse(body)
        return await respond(plan_chat(server, req), request)

    @app.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
    async def tokenize(request: Request):
        req = parse(TokenizeRequest, await read_body(request, limit))
        server.adapter_index(req.model)
        if req.prompt is not None:
            ids = server.text.encode(req.prompt, add_prefix=req.add_special_tokens)
        else:
            tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
            ids = server.text.chat(req.messages, req.add_generation_prompt, tools)
        strs = [server.text.string(i) for i in ids] if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": server.context, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
    async def detokenize(request: Request):
        req = parse(DetokenizeRequest, await read_body(request, limit))
        server.adapter_index(req.model)
        ids = server.text.check_ids(req.tokens, "tokens")
        return {"prompt": server.tokenizer.decode(ids)}

    @app.post("/v1/load_lora_adapter", openapi_extra=body_schema(LoadLoRAAdapterRequest))
    async def load_lora_adapter(request: Request):
        updates = _updates(request)
        req = parse(LoadLoRAAdapterRequest, await read_body(request, limit))
        return PlainTextResponse(await asyncio.to_thread(updates.load, req))

    @app.post("/v1/unload_lora_adapter", openapi_extra=body_schema(UnloadLoRAAdapterRequest))
    async def unload_lora_adapter(request: Request):
        updates = _updates(request)
        req = parse(UnloadLoRAAdapterRequest, await read_body(request, limit))
        return PlainTextResponse(await asyncio.to_thread(updates.unload, req))

    def _updates(request: Request):
        if server.updates is None:
            raise APIError(404, f"{request.method} {request.url.path}: {HOW_TO_ENABLE}", code="not_found")
        return server.updates

    @app.get("/arena")
    async def arena_status():
        if server.arena is None:
            return {"enabled": False, "ready": False, "models": len(server.model_names()),
                    "message": ARENA_HOW_TO_ENABLE}
        return server.arena.status()

    @app.post("/arena/battle", openapi_extra=body_schema(BattleRequest))
    async def arena_battle(request: Request):
        arena = _arena(request)
        return arena.open(parse(BattleRequest, await read_body(request, limit)))

    @app.post("/arena/answer", openapi_extra=body_schema(AnswerRequest))
    async def arena_answer(request: Request):
        arena = _arena(request)
        plan, answer = arena.plan_answer(parse(AnswerRequest, await read_body(request, limit)))
        try:
            return await respond(plan, request, keep=answer.attach)
        finally:
            answer.release()  # only if its run never started (busy, shutting down): then it may be asked again

    @app.post("/arena/vote", openapi_extra=body_schema(VoteRequest))
    async def arena_vote(request: Request):
        arena = _arena(request)
        return await arena.vote(parse(VoteRequest, await read_body(request, limit)))

    def _arena(request: Request):
        if server.arena is None:
            raise APIError(404, f"{request.method} {request.url.path}: {ARENA_HOW_TO_ENABLE}", code="not_found")
        return server.arena

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        return server.text.info(server.context)

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.render(), media_type=server.metrics.content_type)

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(request_schemas(list(BODIES)))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
    return app


def _label(path: str) -> str:
    if path in KNOWN_PATHS:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
