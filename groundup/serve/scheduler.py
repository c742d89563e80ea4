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

    done = sched.between_steps(fn)  # a concurrent Future: fn() run by this thread between two steps

`between_steps` is how the adapter bank changes while serving (serve/adapter_updates.py): fn runs
holding the lock `submit` takes, after the submitted jobs have moved into the core, so it sees every
request (`users`) and no step sees a half-changed bank. A job whose adapter was unloaded after its
request named it is refused at `submit` (AdapterGone).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future

from groundup.errors import ConfigError
from groundup.infer.core import EngineCore, ErrorEvent, PromptEvent, Request, TokenEvent
from groundup.infer.sampling import SamplingConfig

log = logging.getLogger("groundup.serve")

__all__ = ["AdapterGone", "Busy", "ErrorEvent", "PromptEvent", "Scheduler", "TokenEvent", "make_job"]

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


class AdapterGone(Exception):
    """The job's adapter was unloaded (after its request named it, before the job was submitted)."""


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
        self.ops: deque[tuple[object, Future]] = deque()  # between_steps' calls, run in order
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
            bank = self.core.bank
            if job.adapter and (bank is None or not bank.live(job.adapter)):
                raise AdapterGone()
            self.inbox.append((job, queue, asyncio.get_running_loop()))
            self.cv.notify()

    def between_steps(self, fn) -> Future:
        """Run `fn()` on the engine thread between two steps, holding the submit lock; its result (or
        exception) in the returned Future; run at once here before the thread starts, refused (Busy) once stopping."""
        done: Future = Future()
        with self.cv:
            if self.stopping:
                done.set_exception(Busy("the server is shutting down"))
            elif self.thread.is_alive():
                self.ops.append((fn, done))
                self.cv.notify()
            else:
                _settle(done, fn)
        return done

    def users(self, adapter: int) -> int:
        """Requests not finished nor cancelled that use `adapter` (submitted, waiting or running). Between
        steps only: inside a `between_steps` call, or with the thread stopped."""
        items = [job for job, _, _ in self.inbox] + [_request(w) for w in self.core.waiting]
        items += [s.request for s in self.core.running]
        return len({r.id for r in items if r.adapter == adapter and not r.aborted})

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
        metrics, self.core.metrics = self.core.metrics, None  # not a client's request: not in /metrics
        try:
            while self.core.has_work():
                self.core.step()
        finally:
            self.core.metrics = metrics
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
                while not self.stopping and not self.inbox and not self.ops and not self.core.has_work():
                    self.cv.wait()
                if self.stopping:
                    break
                for job, queue, loop in self.inbox:
                    self.routes[job.id] = (queue, loop)
                    self.core.add(job)
                self.inbox.clear()
                while self.ops:  # under the lock: no job arrives while one looks at who uses an adapter
                    fn, done = self.ops.popleft()
                    _settle(done, fn)
            if not self.core.has_work():
                continue
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
            for _, done in self.ops:
                done.set_exception(Busy("the server is shutting down"))
            self.ops.clear()
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


def _request(item) -> Request:
    return item if isinstance(item, Request) else item.request


def _settle(done: Future, fn) -> None:
    try:
        done.set_result(fn())
    except BaseException as e:  # noqa: BLE001 - the caller's to handle; this thread goes on
        done.set_exception(e)


def _put(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)

