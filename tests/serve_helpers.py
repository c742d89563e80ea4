"""Shared by the serve tests: a tiny served model, LoRA adapters on it, a real loopback server in a thread."""

from __future__ import annotations

import logging

import contextlib

import copy
import socket
import threading
import time

import torch

from groundup.interop.peft_format import save_adapter
from groundup.model.lora import LoraConfig, apply_lora, merge_lora
from groundup.serve.server import Limits, Server
from infer_helpers import small_tokenizer, tiny_model

# A wider init than 0.02 keeps greedy argmax ties rare, so batch shapes cannot flip them.
INIT_STD = 0.2


def served_model(seed: int = 0, **overrides):
    return tiny_model(seed, init_std=INIT_STD, **overrides)


def make_adapter(base, path, lora: LoraConfig, seed: int):
    """Save a LoRA adapter with random (non-zero) weights for `base`; return the merged model it makes."""
    model = copy.deepcopy(base)
    apply_lora(model, lora)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    save_adapter(model, lora, path)
    return merge_lora(model).eval()


def make_server(model=None, adapters=None, api_key=None, allow_adapter_updates=False, **limits) -> Server:
    return Server(model if model is not None else served_model(), small_tokenizer(), name="tiny", adapters=adapters,
                  limits=Limits(**limits), api_key=api_key, allow_adapter_updates=allow_adapter_updates)


class LiveServer:
    """uvicorn serving `server` on a free loopback port, in a background thread."""

    def __init__(self, server: Server):
        import uvicorn

        from groundup.serve.app import create_app

        self.server = server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(server), log_level="warning", timeout_graceful_shutdown=5)
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.time() + 30
        while not self.uvicorn.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(30)
        self.sock.close()


def scrape(text: str) -> dict[str, float]:
    """/metrics read by prometheus-client's own parser: each sample's value by its name, summed over its label
    sets (a histogram's `_count`, a counter's `_total`, ...)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


class Watch(logging.Handler):
    """Every record at ERROR or above, and every record that carries a traceback, from any logger."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.bad: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.bad.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def watching_logs():
    """A Watch on the root logger and on uvicorn's, which do not propagate to the root (its "Exception in ASGI
    application" goes to "uvicorn")."""
    handler = Watch()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.access")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
