"""`groundup serve`: an OpenAI-compatible server with continuous batching, LoRA adapters and a chat page.

    groundup serve --model out/model [--adapter sql=adapters/sql ...] [--host 127.0.0.1] [--port 8000]
                   [--api-key KEY] [--max-batch 16] [--max-tokens N] [--allow-adapter-updates]
                   [--arena-log votes.jsonl] [--execute-tools calculator,python [--max-tool-calls 4]]

With --allow-adapter-updates, clients load and unload adapters while it serves, with vLLM's API:
POST /v1/load_lora_adapter {"lora_name": NAME, "lora_path": DIR} and POST /v1/unload_lora_adapter
{"lora_name": NAME} (serve/adapter_updates.py). Off by default: a client could then make the server read
any directory it can (safetensors and JSON only); pair it with --api-key.

With --arena-log FILE (and two models at least, e.g. the base and an adapter), the chat page offers blind
battles: one prompt, two anonymous models drawn at random answering side by side, four vote buttons; each
vote is a line of FILE, a battle log `groundup arena --battles FILE` rates (serve/votes.py).

Listens on 127.0.0.1 unless told otherwise. Ctrl-C (SIGINT) or SIGTERM stops accepting connections,
lets in-flight requests finish for up to --grace seconds, then exits 0; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from groundup.arguments import add_loading_arguments, add_model_argument
from groundup.errors import ConfigError


def serve_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p)
    add_loading_arguments(p, adapter=False)
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR",
                   help="serve a LoRA adapter (groundup's or peft's layout) as model NAME (repeatable)")
    p.add_argument("--allow-adapter-updates", action="store_true",
                   help="let clients load and unload LoRA adapters at run time (POST /v1/load_lora_adapter "
                        "{lora_name, lora_path}, /v1/unload_lora_adapter {lora_name}: vLLM's API); a client can then "
                        "make the server read any adapter directory it can reach, so use --api-key too (default: off)")
    p.add_argument("--arena-log", default=None, metavar="FILE",
                   help="turn on blind battles: the chat page's 'Blind battle' mode sends one prompt to two served "
                        "models drawn at random, shown as Model A and Model B until you vote (A is better, B is "
                        "better, Tie, Both are bad); each vote appends a line to FILE (JSONL with FastChat's battle "
                        "columns: model_a, model_b, winner, ...), which `groundup arena --battles FILE` rates. Needs "
                        "two models at least: the base model and an --adapter (default: off)")
    p.add_argument("--execute-tools", default=None, metavar="TOOLS",
                   help="run these built-in tools on the server (comma-separated: calculator, python): a non-streamed "
                        "chat request gets their definitions, the server runs the model's calls of them in a loop and "
                        "answers with the final message (default: off; calls go back to the client, OpenAI's contract)")
    p.add_argument("--max-tool-calls", type=int, default=4, metavar="N",
                   help="with --execute-tools: calls run per request before the model must answer in text "
                        "(default: 4)")
    p.add_argument("--name", default=None, help="the base model's name in the API (default: the model's directory name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    p.add_argument("--api-key", default=os.environ.get("GROUNDUP_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $GROUNDUP_API_KEY, else no key)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the decode step (compiled once at start-up, then faster steps)")
    g = p.add_argument_group("limits")
    g.add_argument("--max-batch", type=int, default=16, help="rows decoded together (default: 16)")
    g.add_argument("--max-tokens", type=int, default=None, help="most new tokens per choice (default: the context)")
    g.add_argument("--max-n", type=int, default=None, help="most choices per prompt (default: --max-batch)")
    g.add_argument("--max-body-bytes", type=int, default=8 << 20, help="largest request body (default: 8 MiB)")
    g.add_argument("--max-waiting", type=int, default=1024, help="queued requests before 503 (default: 1024)")
    g.add_argument("--max-prefill-tokens", type=int, default=2048,
                   help="prompt tokens prefilled between two decode steps; more: new requests start sooner, "
                        "running ones pause longer (default: 2048)")
    g.add_argument("--kv-blocks", type=int, default=None,
                   help="KV cache blocks of 16 tokens shared by every request (default: --max-batch full contexts); "
                        "when they run out the newest request waits and is resumed later")
    g.add_argument("--grace", type=float, default=30.0, help="seconds in-flight requests get at shutdown (default: 30)")
    from groundup.infer.speculative import add_speculative_arguments

    add_speculative_arguments(p)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="log every request")


def parse_adapters(specs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not sep or not name or not directory:
            raise ConfigError(f"--adapter {spec!r}: expected NAME=DIR", key="adapter")
        if name in out:
            raise ConfigError(f"--adapter {name}: given twice", key="adapter")
        out[name] = directory
    return out


def build_server(args: argparse.Namespace):
    import torch

    from groundup.infer.speculative import speculator_from_args
    from groundup.loading import load_for_inference
    from groundup.serve.server import Limits, Server
    from groundup.serve.votes import require_two

    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads {args.threads}: expected a positive integer", key="threads")
        torch.set_num_threads(args.threads)
    adapters = parse_adapters(args.adapter)
    limits = Limits(max_batch=args.max_batch, max_tokens=args.max_tokens, max_n=args.max_n,
                    max_body_bytes=args.max_body_bytes, max_waiting=args.max_waiting,
                    max_prefill_tokens=args.max_prefill_tokens, kv_blocks=args.kv_blocks)
    limits.validate()
    name = args.name or Path(args.model).resolve().name
    if args.arena_log is not None:  # before the model loads
        require_two([name, *adapters], args.allow_adapter_updates)
    runner = _tool_runner(args.execute_tools, args.max_tool_calls)  # before the model loads
    model, tok = load_for_inference(args.model, args.device, args.dtype, args.tokenizer)
    speculator = speculator_from_args(args, tok, model.device, model.dtype)
    return Server(model, tok, name=name, adapters=adapters, limits=limits, api_key=args.api_key or None,
                  speculator=speculator, compile=args.compile, allow_adapter_updates=args.allow_adapter_updates,
                  arena_log=args.arena_log, tool_runner=runner, max_tool_calls=args.max_tool_calls)


def _tool_runner(spec: str | None, max_tool_calls: int):
    """--execute-tools: built-in tools only (a `module:function` would run a user's code for any client)."""
    from groundup.tools import ToolRunner, resolve_tools

    if max_tool_calls < 1:
        raise ConfigError(f"--max-tool-calls {max_tool_calls}: expected at least 1", key="max_tool_calls")
    if spec is None:
        return None
    if ":" in spec:
        raise ConfigError(f"--execute-tools {spec}: only built-in tools run on the server (calculator, python); "
                          "a module:function tool is the client's to run", key="execute_tools")
    return ToolRunner(resolve_tools(spec))


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from groundup.serve.app import create_app

    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port {args.port}: expected 0..65535", key="port")
    server = build_server(args)
    app = create_app(server)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            access_log=args.access_log, timeout_graceful_shutdown=args.grace)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not server.api_key:
        print(f"warning: listening on {args.host} without --api-key: anyone who can reach this port can use the model",
              file=sys.stderr)
    if server.updates is not None and not server.api_key:
        print("warning: --allow-adapter-updates without --api-key: anyone who can reach this port can make the "
              "server load adapters from its disk", file=sys.stderr)
    names = ", ".join(server.model_names())
    where = f"http://{args.host}:{args.port}"
    print(f"serving {names} on {where} (chat page: {where}/, API: {where}/v1; "
          f"batch {server.limits.max_batch}, context {server.context}"
          f"{', API key required' if server.api_key else ''}"
          f"{', adapters load and unload at run time' if server.updates is not None else ''}"
          f"{', runs the tools ' + args.execute_tools if server.tool_runner is not None else ''})",
          file=sys.stderr, flush=True)
    if server.arena is not None:
        print(f"blind battles: {where}/#arena, votes appended to {args.arena_log}", file=sys.stderr, flush=True)
    graceful_server(config).run()
    print("server stopped", file=sys.stderr, flush=True)
    return 0


def graceful_server(config):
    """uvicorn's server, with SIGINT/SIGTERM meaning: stop accepting, finish in-flight requests within
    the grace period, exit normally (uvicorn itself re-raises the signal once done); a second
    SIGINT exits at once (uvicorn's handle_exit)."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    return GracefulServer(config)
