"""A chat model behind one interface: conversations in, replies out, batched, whoever serves it.

    source = open_source("out/sft")                               # a groundup checkpoint, run in-process
    source = open_source("http://localhost:8000/v1#tiny-sft")     # any OpenAI-compatible endpoint (#model)
    source = open_source("https://api.example.com/v1")            # the model named by the server's /v1/models
    replies = source.chat([[{"role": "user", "content": "2+3?"}]], max_tokens=64, temperature=0.0, seed=0)

The promises:
- `chat` returns one reply per conversation, in order. Row i samples with seed `seed + i`, the engine's
  rule (infer/engine.py): a checkpoint's row i is exactly what `Generator.chat(conversation, seed=seed + i)`
  (and so `groundup chat`) gives; an endpoint gets `seed + i` as the request's `seed`.
- A checkpoint (model directory, training run, adapter) is loaded once with `load_for_inference` and every
  call runs through the one engine (its chat template, batching, prefix cache), one call at a time (a lock).
  A reply gets at most half the model's context (as `groundup chat` leaves it), and a conversation longer than
  the rest loses tokens from its start (the end, where the question and the request for a verdict are, stays).
- An endpoint is reached with the official `openai` client: each request has a timeout, and the client's
  own retries (exponential backoff, Retry-After honoured) cover timeouts, lost connections, 408, 409, 429
  and 5xx. Requests go out on `concurrency` threads, spaced to at most `rate` a second. The API key is read
  from the environment variable `api_key_env` (OPENAI_API_KEY by default) and is never taken from a flag,
  written to disk or shown: `name` is the URL without credentials, then `#model`.
- A request that still fails raises SourceError after every other row of the call has finished; its
  `results` hold the replies that did come back (None for the rest), so a caller can keep them.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable
from urllib.parse import urlsplit

import torch

from groundup.config import fail
from groundup.data.annotate import base_url, shown_url
from groundup.data.annotate_client import FATAL_STATUS, RateLimiter
from groundup.errors import DataError
from groundup.infer.engine import Generator
from groundup.infer.sampling import SamplingConfig
from groundup.infer.structured import Structured

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


@runtime_checkable
class ChatSource(Protocol):
    name: str  # how the source is named in logs and reports (never holds a key)

    def chat(self, conversations: list[list[dict]], max_tokens: int, temperature: float, seed: int) -> list[str]:
        """One assistant reply per conversation (lists of {role, content}); row i is seeded `seed + i`."""
        ...


class SourceError(DataError):
    """A request that failed for good; `results` holds the call's replies that did come back (None: failed)."""

    def __init__(self, message: str, results: list[str | None] | None = None, fatal: bool = False):
        super().__init__(message)
        self.results = results or []
        self.fatal = fatal  # the same for every request (a wrong key, URL or model): no rerun will help


def is_endpoint(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def open_source(spec: str, device: str = "cpu", *, dtype: str = "float32", api_key_env: str = DEFAULT_API_KEY_ENV,
                timeout: float = 120.0, retries: int = 3, rate: float = 0.0, concurrency: int = 8,
                name: str | None = None, structured: Structured | None = None) -> ChatSource:
    """`http(s)://URL[#model]`: an OpenAI-compatible endpoint (the model from /v1/models when not named);
    anything else: a groundup checkpoint on `device` in `dtype`. `name` overrides the source's name.
    `structured`: an in-process model's replies are decoded under this constraint (an endpoint's are not)."""
    if is_endpoint(spec):
        return EndpointSource(spec, api_key_env=api_key_env, timeout=timeout, retries=retries, rate=rate,
                              concurrency=concurrency, name=name)
    return EngineSource(spec, device=device, dtype=dtype, name=name, structured=structured)


class EngineSource:
    """A groundup checkpoint answering in this process through the engine."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: str = "float32", name: str | None = None,
                 generator: Generator | None = None, structured: Structured | None = None):
        self.name = name or str(path)
        self.structured = structured  # every reply decoded under this constraint (infer/structured.py); None: free
        self.generator = generator or Generator.from_checkpoint(path, device=device, dtype=dtype)
        self.lock = threading.Lock()

    def chat(self, conversations: list[list[dict]], max_tokens: int, temperature: float, seed: int) -> list[str]:
        if not conversations:
            return []
        gen = self.generator
        room = min(max_tokens, max(1, gen.cfg.max_seq_len // 2))
        cfg = SamplingConfig(max_new_tokens=room, temperature=temperature, seed=seed, overflow="truncate",
                             structured=self.structured)
        rows = [gen.prompts.chat(_messages(c, i)) for i, c in enumerate(conversations)]
        with self.lock, torch.inference_mode():
            return [c.text for c in gen.complete_ids(rows, cfg)]


class EndpointSource:
    """An OpenAI-compatible chat completions endpoint (see the module docstring)."""

    def __init__(self, spec: str, *, api_key_env: str = DEFAULT_API_KEY_ENV, timeout: float = 120.0,
                 retries: int = 3, rate: float = 0.0, concurrency: int = 8, name: str | None = None):
        try:
            import openai  # the `web`/`bench` extras: the core installs without it
        except ImportError:
            raise DataError("an endpoint source talks through the openai package: pip install 'groundup[web]'") \
                from None
        url, _, model = spec.partition("#")
        if not urlsplit(url).netloc:
            fail("source", shown_url(url), "an http:// or https:// URL such as http://localhost:8000/v1#model")
        if not api_key_env or not api_key_env.replace("_", "").isalnum():
            fail("api_key_env", api_key_env, "the name of an environment variable holding the API key")
        if timeout <= 0:
            fail("timeout", timeout, "seconds, more than 0")
        if retries < 0:
            fail("retries", retries, "an integer of at least 0")
        if concurrency < 1:
            fail("concurrency", concurrency, "an integer of at least 1")
        if rate < 0:
            fail("rate", rate, "requests per second, 0 for no limit")
        key = os.environ.get(api_key_env, "")
        if not key and api_key_env != DEFAULT_API_KEY_ENV:
            fail("api_key_env", api_key_env, "an environment variable that holds the API key (it is unset or empty)")
        self.openai = openai
        self.url = base_url(url)
        self.client = openai.OpenAI(base_url=self.url, api_key=key or "none", timeout=timeout, max_retries=retries)
        self.model = model or self._served_model()
        self.name = name or f"{shown_url(self.url)}#{self.model}"
        self.concurrency, self.limiter = concurrency, RateLimiter(rate)
        self.stop = threading.Event()  # never set here: RateLimiter's way to end a wait early

    def _served_model(self) -> str:
        try:
            ids = sorted(m.id for m in self.client.models.list())
        except self.openai.OpenAIError as e:
            raise SourceError(f"{shown_url(self.url)}: cannot list the served models ({_short(e)}); name the model "
                              "as URL#model", fatal=True) from None
        if len(ids) != 1:
            raise SourceError(f"{shown_url(self.url)} serves {len(ids)} models ({', '.join(ids[:10]) or 'none'}): "
                              "name one as URL#model", fatal=True)
        return ids[0]

    def chat(self, conversations: list[list[dict]], max_tokens: int, temperature: float, seed: int) -> list[str]:
        messages = [_messages(c, i) for i, c in enumerate(conversations)]
        results: list[str | None] = [None] * len(messages)
        errors: list[tuple[int, str, bool]] = []

        def one(i: int) -> None:
            self.limiter.wait(self.stop)
            try:
                results[i] = self._ask(messages[i], max_tokens, temperature, seed + i)
            except SourceError as e:
                errors.append((i, str(e), e.fatal))

        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(messages)))) as pool:
            list(pool.map(one, range(len(messages))))
        if errors:
            i, why, fatal = min(errors)
            raise SourceError(f"{self.name}: {len(errors)} of {len(messages)} requests failed; row {i}: {why}",
                              results, fatal=any(f for _, _, f in errors))
        return results  # type: ignore[return-value]

    def _ask(self, messages: list[dict], max_tokens: int, temperature: float, seed: int) -> str:
        openai = self.openai
        try:
            response = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=max_tokens,
                                                           temperature=temperature, seed=seed)
        except openai.APIStatusError as e:
            hint = FATAL_STATUS.get(e.status_code)
            raise SourceError(f"HTTP {e.status_code}: {_short(e.message)}" + (f" ({hint})" if hint else ""),
                              fatal=hint is not None) from None
        except openai.APITimeoutError:
            raise SourceError("no answer before the timeout, after every retry") from None
        except openai.APIConnectionError as e:
            raise SourceError(f"cannot connect: {_short(e.__cause__ or e)}") from None
        except (ValueError, TypeError, openai.APIResponseValidationError) as e:
            raise SourceError(f"the answer is not JSON ({_short(e)})") from None
        choices = getattr(response, "choices", None)
        message = getattr(choices[0], "message", None) if isinstance(choices, list) and choices else None
        content = getattr(message, "content", None)
        if not isinstance(content, str):
            raise SourceError("the answer has no choices[0].message.content")
        return content


def _messages(conversation: Sequence[dict], index: int) -> list[dict]:
    """The conversation as plain {role, content} dicts, or DataError naming the row."""
    if not isinstance(conversation, (list, tuple)) or not conversation:
        raise DataError(f"conversation {index}: expected a non-empty list of messages")
    out = []
    for m in conversation:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"conversation {index}: every message needs a string role and content")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _short(e: object, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "..."
