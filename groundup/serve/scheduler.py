"""The server's driver of the one engine: a thread that steps the engine core, events handed to the event loop.

    sched = Scheduler(model, tokenizer, bank, max_batch=16); sched.start()
    job = make_job(prompt_ids, SamplingConfig(max_new_tokens=32, temperature=0), n=1)
    sched.submit(job, queue)        # from the event loop; events arrive on the asyncio queue
    ...                             # TokenEvent per token per choice, the last one with finish_reason
    sched.cancel(job)               # a client that went away: its sequences leave at the next step

The core (groundup/infer/core.py) is the one `generate`, `chat`, evaluation and training's sampling use:
continuous batching over the paged KV cache with prefix caching, preemption when the blocks run out.
This thread owns the model. Each turn it moves submitted jobs into the core, runs one engine step and
hands that step's events to each job's event loop (`call_soon_threadsafe`), so a short request never
waits for a long one to end and a new one waits at most one step plus the prefills admitted before it.
Choice i of a job samples with seed `seed + i`, as row i of `Generator.generate`, so a seeded request
gets the tokens the engine gives the same prompt alone.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque

from groundup.errors import ConfigError
from groundup.infer.core import EngineCore, ErrorEvent, PromptEvent, Request, TokenEvent
from groundup.infer.sampling import SamplingConfig

log = logging.getLogger("groundup.serve")

__all__ = ["Busy", "ErrorEvent", "PromptEvent", "Scheduler", "TokenEvent", "make_job"]

Job = Request  # what the server submits: one prompt and its n choices


def make_job(prompt: list[int], sampling: SamplingConfig, n: int = 1, adapter: int = 0,
             prompt_logprobs: int | None = None, generate: bool = True, base_index: int = 0,
             ignore_eos: bool = False) -> Request:
    """A request of `n` choices (choice i seeded `sampling.seed + i`)."""
    return Request(prompt, sampling, seeds=[sampling.seed + i for i in range(n)], adapter=adapter,
                   stop_ids=frozenset() if ignore_eos else None, prompt_logprobs=prompt_logprobs, generate=generate,
                   base_index=base_index)


class Busy(Exception):
    """The waiting queue is full."""


class Scheduler:
    def __init__(self, model, tokenizer, bank=None, max_batch: int = 16, max_prefill_tokens: int = 2048,
                 max_waiting: int = 1024, metrics=None, kv_blocks: int | None = None, block_size: int = 16,
                 speculator=None, compile: bool = False):
        context_blocks = -(-model.cfg.max_seq_len // block_size) + 1
        if kv_blocks is not None and kv_blocks < context_blocks:
            raise ConfigError(f"kv_blocks = {kv_blocks}: at least {context_blocks} blocks of {block_size} tokens, so "
                              f"one request can fill the model's context ({model.cfg.max_seq_len})", key="kv_blocks")
        self.core = EngineCore(model, tokenizer, max_batch=max_batch, kv_blocks=kv_blocks, block_size=block_size,
                               max_prefill_tokens=max_prefill_tokens, bank=bank, metrics=metrics,
                               speculator=speculator, compile=compile)
        self.model, self.tok, self.metrics = model, tokenizer, metrics
        self.max_waiting = max_waiting
        self.inbox: deque[tuple[Request, asyncio.Queue, asyncio.AbstractEventLoop]] = deque()
        self.routes: dict[int, tuple[asyncio.Queue, asyncio.AbstractEventLoop]] = {}  # request id -> where to
        self.cv = threading.Condition()
        self.stopping = False
        self.ready = False  # set once the warm-up step has run
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="groundup-decode", daemon=True)

    # ------------------------------------------------------------------ the event loop's side

    def start(self, wait: float = 300.0) -> None:
        """Start the engine thread and wait (up to `wait` s) for its warm-up step."""
        self.thread.start()
        self._ready.wait(wait)

    def stop(self, timeout: float = 10.0) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def submit(self, job: Request, queue: asyncio.Queue) -> None:
        """Queue a job; its events go to `queue` on the calling event loop. Raises Busy when full."""
        job.arrival = time.perf_counter()
        with self.cv:
            if self.stopping:
                raise Busy("the server is shutting down")
            if self.queued >= self.max_waiting:
                raise Busy(f"{self.queued} requests are waiting already")
            self.inbox.append((job, queue, asyncio.get_running_loop()))
            self.cv.notify()

    def cancel(self, job: Request) -> None:
        if not job.aborted:
            self.core.abort(job)  # a flag the engine thread reads at its next step
            with self.cv:
                self.cv.notify()

    @property
    def running(self) -> int:
        return len(self.core.running)

    @property
    def queued(self) -> int:
        return len(self.inbox) + self.core.queued

    @property
    def steps(self) -> int:
        """Decode steps taken."""
        return self.core.steps

    @property
    def kv_blocks_used(self) -> tuple[int, int]:
        """(blocks held by sequences, blocks in the pool)."""
        return self.core.pool.used, self.core.pool.num_blocks - 1

    # ------------------------------------------------------------------ the engine thread

    def _warmup(self) -> None:
        """One tiny request, so the first client does not pay for the kernels' first calls."""
        filler = self.core.filler
        warm = Request([filler, filler], SamplingConfig(max_new_tokens=2, temperature=0), stop_ids=frozenset())
        self.core.add(warm)
        while self.core.has_work():
            self.core.step()
        self.core.clear_prefix_cache()

    def _run(self) -> None:
        try:
            self._warmup()
        except Exception:  # noqa: BLE001 - a broken model shows on the first request instead
            log.exception("warm-up failed")
            self.core.abort_all()
        self.ready = True
        self._ready.set()
        while True:
            with self.cv:
                while not self.stopping and not self.inbox and not self.core.has_work():
                    self.cv.wait()
                if self.stopping:
                    break
                arrived = list(self.inbox)
                self.inbox.clear()
            for job, queue, loop in arrived:
                self.routes[job.id] = (queue, loop)
                self.core.add(job)
            try:
                events = self.core.step()
            except Exception as e:  # noqa: BLE001 - fail the requests, keep serving
                log.exception("engine step failed")
                jobs = {s.request.id: s.request for s in self.core.running}
                jobs |= {w.id if isinstance(w, Request) else w.request.id: w if isinstance(w, Request) else w.request
                         for w in self.core.waiting}
                self.core.abort_all()
                events = [ErrorEvent(j, f"generation failed: {type(e).__name__}: {e}") for j in jobs.values()]
            self._deliver(events)
        with self.cv:
            leftover = [job for job, _, _ in self.inbox]
            self.inbox.clear()
        leftover += [s.request for s in self.core.running]
        leftover += [w if isinstance(w, Request) else w.request for w in self.core.waiting]
        self.core.abort_all()
        self._deliver([ErrorEvent(j, "the server is shutting down") for j in {j.id: j for j in leftover}.values()])

    def _deliver(self, events: list) -> None:
        """Each event to its job's loop, one call per loop; a job's route is dropped once it is done."""
        by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list]] = {}
        for ev in events:
            route = self.routes.get(ev.request.id)
            if route is None:
                continue
            queue, loop = route
            by_loop.setdefault(id(loop), (loop, []))[1].append((queue, ev))
        for rid in [rid for rid in self.routes if not self._alive(rid)]:
            del self.routes[rid]
        for loop, items in by_loop.values():
            try:
                loop.call_soon_threadsafe(_put, items)
            except RuntimeError:  # that loop is closed: nobody is listening any more
                pass

    def _alive(self, request_id: int) -> bool:
        core = self.core
        return any(s.request.id == request_id for s in core.running) or any(
            (w.id if isinstance(w, Request) else w.request.id) == request_id for w in core.waiting)


def _put(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)

