"""What a serving process holds: one model, its tokenizer, the adapters, the scheduler, limits and metrics.

    server = Server(model, tokenizer, name="tiny", adapters={"sql": "adapters/sql"}, limits=Limits(max_batch=16))
    app = create_app(server)        # groundup.serve.app; the app starts and stops the scheduler

The base model is served as `name`, each adapter as its own name (the request's `model` field picks
one); the base weights exist once (serve/adapters.py). With `allow_adapter_updates`, clients load and
unload adapters while it serves (serve/adapter_updates.py: `updates`). With `arena_log`, people vote on blind
battles between two of the served models, appended to that file (serve/votes.py: `arena`). With `tool_runner`,
the server runs those tools itself for non-streamed chats (serve/tool_exec.py), up to `max_tool_calls` a request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from groundup.config import did_you_mean
from groundup.errors import ConfigError
from groundup.serve.adapter_updates import AdapterUpdates
from groundup.serve.adapters import AdapterBank
from groundup.serve.metrics import Metrics
from groundup.serve.protocol import APIError
from groundup.serve.scheduler import Scheduler
from groundup.serve.tokens import TokenText
from groundup.serve.votes import Arena


@dataclass
class Limits:
    max_batch: int = 16  # rows decoded together (the batch's slots)
    max_tokens: int | None = None  # most new tokens one choice may ask for (default: the context)
    max_n: int | None = None  # most choices per prompt (default: max_batch)
    max_prompts: int = 1024  # prompts in one completions request
    max_body_bytes: int = 8 << 20  # request bodies above this get 413
    max_waiting: int = 1024  # queued requests beyond this get 503
    max_prefill_tokens: int = 2048  # prompt tokens prefilled between two decode steps (at least one request)
    kv_blocks: int | None = None  # the paged KV cache's blocks of 16 tokens (default: max_batch full contexts)

    def validate(self) -> None:
        for key in ("max_batch", "max_prompts", "max_body_bytes", "max_waiting", "max_prefill_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} = {getattr(self, key)}: expected a positive integer", key=key)
        for key in ("max_tokens", "max_n", "kv_blocks"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key} = {value}: expected a positive integer", key=key)


class Server:
    def __init__(self, model, tokenizer, name: str = "groundup", adapters: dict[str, str | Path] | None = None,
                 limits: Limits | None = None, api_key: str | None = None, speculator=None,
                 compile: bool = False, allow_adapter_updates: bool = False, arena_log: str | Path | None = None,
                 tool_runner=None, max_tool_calls: int = 4):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.limits = limits or Limits()
        self.limits.validate()
        self.context = model.cfg.max_seq_len
        self.max_tokens = min(self.limits.max_tokens or self.context, self.context)
        self.max_n = min(self.limits.max_n or self.limits.max_batch, self.limits.max_batch)
        self.api_key = api_key
        self.text = TokenText(tokenizer)
        self.bank = AdapterBank(model)
        for adapter_name, adapter_dir in (adapters or {}).items():
            if adapter_name == name:
                raise ConfigError(f"adapter name {adapter_name!r} is the base model's name; pick another",
                                  key="adapter")
            self.bank.add(adapter_name, adapter_dir)
        self.metrics = Metrics(model_name=name, max_model_len=self.context)
        self.scheduler = Scheduler(model, tokenizer, self.bank,
                                   max_batch=self.limits.max_batch, max_prefill_tokens=self.limits.max_prefill_tokens,
                                   max_waiting=self.limits.max_waiting, metrics=self.metrics,
                                   kv_blocks=self.limits.kv_blocks, speculator=speculator,
                                   compile=compile)
        self.metrics.scheduler = self.scheduler
        self.created = int(time.time())
        self.started = False
        self.updates = AdapterUpdates(self) if allow_adapter_updates else None
        self.arena = None if arena_log is None else Arena(self, arena_log, models_can_change=allow_adapter_updates)
        self.tool_runner = tool_runner  # a tools.ToolRunner: the tools run here (serve/tool_exec.py); None: none
        if max_tool_calls < 1:
            raise ConfigError(f"max_tool_calls = {max_tool_calls}: expected at least 1", key="max_tool_calls")
        self.max_tool_calls = max_tool_calls  # executed calls per request before the model must answer in text

    def start(self) -> None:
        if not self.started:
            self.scheduler.start()
            self.started = True

    def stop(self) -> None:
        self.scheduler.stop()

    def adapter_index(self, model: str | None) -> tuple[str, int]:
        """(served name, adapter index) for a request's `model` (absent: the base model)."""
        if model is None or model == self.name:
            return self.name, 0
        index = self.bank.find(model)
        if index is not None:
            return model, index

        raise APIError(404, f"The model `{model}` does not exist{did_you_mean(model, self.model_names())}; "
                            f"served: {', '.join(self.model_names())}", param="model", code="model_not_found")

    def model_names(self) -> list[str]:
        return [self.name, *self.bank.names]

    def models(self) -> dict:
        data = [{"id": self.name, "object": "model", "created": self.created, "owned_by": "groundup",
                 "root": self.name, "parent": None, "max_model_len": self.context}]
        for _, slot in self.bank.loaded():
            data.append({"id": slot.name, "object": "model", "created": slot.created, "owned_by": "groundup",
                         "root": slot.dir, "parent": self.name, "max_model_len": self.context})
        return {"object": "list", "data": data}
