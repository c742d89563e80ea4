"""Continuous batching: one model, one decode loop, requests joining and leaving the batch at every step.

    sched = Scheduler(model, tokenizer, bank, max_batch=16); sched.start()
    job = Job(prompt_ids, SamplingConfig(max_new_tokens=32, temperature=0), n=1)
    sched.submit(job, queue)        # from the event loop; events arrive on the asyncio queue
    ...                             # TokenEvent per token per choice, the last one with finish_reason
    sched.cancel(job)               # a client that went away: its rows leave at the next step

One background thread owns the model. Each turn of its loop:

1. rows whose request was cancelled leave the batch (their slot is free at once);
2. waiting requests are admitted while slots are free, within a budget of prompt tokens per turn
   (`max_prefill_tokens`; at least one request): those that asked for prompt log-probs (`echo` +
   `logprobs`) are scored with `model.logprobs.token_stats` (the shared scorer); the rest are
   prefilled in groups of similar length (left-padded, at most 25% padding) into a fresh
   `KVCache`, once per request however many choices it has; each choice samples its first token
   and the K/V is copied into a free row of the `SlotCache`;
3. one decode step runs on every active row (one token each, `SlotCache` gives each row its own
   length); rows that finish (a stop token or string, their token limit) leave the batch.

So a short request never waits for a long one to end, and a new one waits at most one step plus the
prefills admitted before it. Each row decodes exactly as the engine decodes a prompt alone: the
same prompt ids, RoPE positions from the row's start, padding masked, the engine's `Sampler` (per
row, with a generator seeded by the request's `seed`; choice i of `n` uses seed + i) and its
`TextStream` (stop strings, UTF-8 held back). Greedy rows therefore give the engine's tokens, and a
seeded sampled row the tokens `Generator.generate([prompt], seed=seed)` samples, up to float
rounding between batch shapes (which can flip a near-tie; tested equal on the test models).
Events are handed to the event loop once per turn (`call_soon_threadsafe`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from groundup.infer.sampling import Sampler, SamplingConfig
from groundup.infer.text_stream import TextStream
from groundup.model.heads import Logits
from groundup.model.kv_cache import KVCache
from groundup.model.logprobs import token_stats
from groundup.model.loss import IGNORE_INDEX
from groundup.serve.batch_cache import SlotCache

log = logging.getLogger("groundup.serve")


@dataclass
class Job:
    """One prompt and its `n` choices, as the scheduler sees a request."""

    prompt: list[int]
    sampling: SamplingConfig  # max_new_tokens, sampling, seed, stop strings, logprobs/top_logprobs
    n: int = 1
    adapter: int = 0  # AdapterBank index; 0 = the base model
    prompt_logprobs: int | None = None  # echo + logprobs: top-k per prompt position (0 = the token's own only)
    generate: bool = True  # False: max_tokens 0 (echo only)
    base_index: int = 0  # choice i is reported as base_index + i
    ignore_eos: bool = False  # stop tokens do not end the row (benchmarks)
    queue: asyncio.Queue | None = field(default=None, repr=False)
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    cancelled: bool = False
    arrival: float = 0.0
    first_token_at: float | None = None


@dataclass
class TokenEvent:
    index: int  # choice index
    token: int | None  # None: no new token (a held-back tail, or nothing generated)
    text: str  # text that became final with this token
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    finish_reason: str | None = None  # set on a choice's last event: "stop" or "length"


@dataclass
class PromptEvent:
    """Log-probs of the prompt's tokens (None for the first); `top` per position, or None."""

    base_index: int  # the job's first choice
    logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None] | None


@dataclass
class ErrorEvent:
    message: str


class Busy(Exception):
    """The waiting queue is full."""


class _Row:
    __slots__ = ("job", "index", "sampler", "stream", "max_new", "count", "last", "logprobs")

    def __init__(self, job: Job, index: int, sampler: Sampler, stream: TextStream, max_new: int):
        self.job, self.index, self.sampler, self.stream, self.max_new = job, index, sampler, stream, max_new
        self.count, self.last = 0, -1
        self.logprobs = job.sampling.logprobs


class Scheduler:
    PAD_WASTE = 1.25  # a prefill group's padded tokens stay within this factor of its real ones

    def __init__(self, model, tokenizer, bank=None, max_batch: int = 16, max_prefill_tokens: int = 2048,
                 max_waiting: int = 1024, metrics=None, cache_headroom: int | None = None):
        self.model, self.tok, self.bank, self.metrics = model, tokenizer, bank, metrics
        self.cfg = model.cfg
        self.device = model.device
        self.dtype = model.dtype
        self.vocab = tokenizer.vocab_size
        self.stop_ids = frozenset(tokenizer.stop_ids)
        self.filler = tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eot_id or 0)
        self.max_batch, self.max_prefill_tokens, self.max_waiting = max_batch, max_prefill_tokens, max_waiting
        self.cache = SlotCache(self.cfg, max_batch, self.device, self.dtype, cache_headroom)
        self.rows: list[_Row] = []  # row b of the batch is slot b of the cache
        self.waiting: deque[Job] = deque()
        self.cv = threading.Condition()
        self.stopping = False
        self.ready = False  # set once the warm-up forward has run
        self._ready = threading.Event()
        self.steps = 0
        self._outbox: list[tuple[Job, object]] = []
        self.thread = threading.Thread(target=self._run, name="groundup-decode", daemon=True)

    # ------------------------------------------------------------------ the event loop's side

    def start(self, wait: float = 300.0) -> None:
        """Start the decode thread and wait (up to `wait` s) for its warm-up forward."""
        self.thread.start()
        self._ready.wait(wait)

    def stop(self, timeout: float = 10.0) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def submit(self, job: Job, queue: asyncio.Queue) -> None:
        """Queue a job; its events go to `queue` on the calling event loop. Raises Busy when full."""
        job.queue, job.loop, job.arrival = queue, asyncio.get_running_loop(), time.perf_counter()
        with self.cv:
            if self.stopping:
                raise Busy("the server is shutting down")
            if len(self.waiting) >= self.max_waiting:
                raise Busy(f"{len(self.waiting)} requests are waiting already")
            self.waiting.append(job)
            self.cv.notify()

    def cancel(self, job: Job) -> None:
        if not job.cancelled:
            job.cancelled = True
            with self.cv:
                self.cv.notify()

    @property
    def running(self) -> int:
        return len(self.rows)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    # ------------------------------------------------------------------ the decode thread

    def _warmup(self) -> None:
        """One prefill and one step, so the first request does not pay for the kernels' first calls."""
        with torch.inference_mode():
            kv = KVCache(self.cfg, 1, 2, self.device, self.dtype)
            self._select([0])
            self.model(torch.full((1, 2), self.filler, dtype=torch.long, device=self.device), head=Logits(last_only=True), cache=kv)
            self.cache.insert(kv, 0, 0, 2)
            self.model(torch.full((1, 1), self.filler, dtype=torch.long, device=self.device), cache=self.cache)
            self.cache.remove(0)

    def _run(self) -> None:
        try:
            self._warmup()
        except Exception:  # noqa: BLE001 - a broken model shows on the first request instead
            log.exception("warm-up failed")
            self.cache.clear()
        self.ready = True
        self._ready.set()
        while True:
            with self.cv:
                while not self.stopping and not self.waiting and not self.rows:
                    self.cv.wait()
                if self.stopping:
                    break
                admitted = self._take()
            try:
                with torch.inference_mode():
                    self._drop_cancelled()
                    if admitted:
                        self._admit(admitted)
                    if self.rows:
                        self._step()
            except Exception as e:  # noqa: BLE001 - fail the requests, keep serving
                log.exception("decode loop failed")
                jobs = {id(r.job): r.job for r in self.rows} | {id(j): j for j in admitted}
                for job in jobs.values():
                    self._outbox.append((job, ErrorEvent(f"generation failed: {type(e).__name__}: {e}")))
                self.rows.clear()
                self.cache.clear()
            self._flush()
        with self.cv:
            leftover = {id(r.job): r.job for r in self.rows} | {id(j): j for j in self.waiting}
            self.waiting.clear()
        for job in leftover.values():
            self._outbox.append((job, ErrorEvent("the server is shutting down")))
        self.rows.clear()
        self._flush()

    def _take(self) -> list[Job]:
        """Waiting jobs that fit the free slots and the prefill budget (at least one if any fits)."""
        free, out, tokens = self.cache.free, [], 0
        while self.waiting:
            job = self.waiting[0]
            if job.cancelled:
                self.waiting.popleft()
                continue
            need = job.n if job.generate else 0  # slots it takes
            if need > free or (out and tokens + len(job.prompt) > self.max_prefill_tokens):
                break
            out.append(self.waiting.popleft())
            free, tokens = free - need, tokens + len(job.prompt)
        return out

    def _drop_cancelled(self) -> None:
        for b in range(len(self.rows) - 1, -1, -1):
            if self.rows[b].job.cancelled:
                self._remove(b)

    def _remove(self, b: int) -> None:
        self.cache.remove(b)
        last = self.rows.pop()
        if b < len(self.rows):
            self.rows[b] = last

    def _select(self, adapters: list[int]) -> None:
        if self.bank is not None:
            self.bank.select(adapters)

    def _admit(self, jobs: list[Job]) -> None:
        jobs = [j for j in jobs if not j.cancelled]
        scored = [j for j in jobs if j.prompt_logprobs is not None]
        if scored:
            self._score(scored)
        for job in jobs:
            if not job.generate:
                for i in range(job.n):
                    self._outbox.append((job, TokenEvent(job.base_index + i, None, "", finish_reason="length")))
        groups: list[list[Job]] = []  # by prompt length, so padding wastes little
        for job in sorted((j for j in jobs if j.generate), key=lambda j: len(j.prompt)):
            if groups and self._fits(groups[-1], job):
                groups[-1].append(job)
            else:
                groups.append([job])
        for group in groups:
            self._prefill(group)

    def _fits(self, group: list[Job], job: Job) -> bool:
        """Whether `job` (at least as long as every prompt in `group`) joins its left-padded prefill."""
        padded = (len(group) + 1) * len(job.prompt)
        return padded <= self.PAD_WASTE * (sum(len(j.prompt) for j in group) + len(job.prompt)) \
            and padded <= self.max_prefill_tokens

    def _prefill(self, group: list[Job]) -> None:
        """One left-padded forward over the group's prompts (once per job: its n choices share the
        K/V and the first logits), then each choice samples its first token and takes a slot."""
        longest = len(group[-1].prompt)
        pads = [longest - len(j.prompt) for j in group]
        ids = torch.full((len(group), longest), self.filler, dtype=torch.long)
        for b, job in enumerate(group):
            ids[b, pads[b]:] = torch.tensor(job.prompt, dtype=torch.long)
        pad_lens = torch.tensor(pads, device=self.device) if any(pads) else None
        kv = KVCache(self.cfg, len(group), longest, self.device, self.dtype, pad_lens)
        self._select([j.adapter for j in group])
        logits = self.model(ids.to(self.device), head=Logits(last_only=True), cache=kv).logits[:, -1]
        if self.metrics is not None:
            self.metrics.prompt_tokens(sum(len(j.prompt) for j in group))
        rows, source = [], []
        for b, job in enumerate(group):
            max_new = min(job.sampling.max_new_tokens, self.cfg.max_seq_len - len(job.prompt))
            stops = () if job.ignore_eos else self.stop_ids
            for i in range(job.n):
                cfg = dataclasses.replace(job.sampling, seed=job.sampling.seed + i)
                sampler = Sampler(cfg, [job.prompt], self.vocab, self.device)
                rows.append(_Row(job, job.base_index + i, sampler, TextStream(self.tok, stops, cfg.stop), max_new))
                source.append(b)
        if len(rows) > len(group):
            logits = logits[torch.tensor(source, device=self.device)]
        for row, b, done in zip(rows, source, self._sample(rows, logits)):
            if not done:
                self.cache.insert(kv, b, pads[b], len(group[b].prompt))
                self.rows.append(row)

    def _step(self) -> None:
        tokens = torch.tensor([[r.last] for r in self.rows], dtype=torch.long, device=self.device)
        self._select([r.job.adapter for r in self.rows])
        logits = self.model(tokens, cache=self.cache).logits[:, -1]
        self.steps += 1
        if self.metrics is not None:
            self.metrics.decode_step(len(self.rows))
        done = self._sample(self.rows, logits)
        for b in range(len(done) - 1, -1, -1):
            if done[b]:
                self._remove(b)

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> list[bool]:
        """Sample each row's next token, push it to its stream, queue its event; which rows finished."""
        picked = [r.sampler(logits[b : b + 1]) for b, r in enumerate(rows)]
        chosen = torch.cat(picked)
        # Sampler.scores gives per row (log p, top-k[, more]): the first two are what the API reports.
        scores = [r.sampler.scores(logits[b : b + 1], picked[b])[0][:2] if r.logprobs else (None, None)
                  for b, r in enumerate(rows)]
        now = time.perf_counter()
        finished = []
        for r, token, (lp, top) in zip(rows, chosen.tolist(), scores):
            job = r.job
            if job.first_token_at is None:
                job.first_token_at = now
                if self.metrics is not None:
                    self.metrics.first_token(now - job.arrival)
            text = r.stream.push(token)
            r.count, r.last = r.count + 1, token
            finish = None
            if r.stream.done:
                finish = "stop"
            elif r.count >= r.max_new:
                text += r.stream.finish("length")
                finish = "length"
            self._outbox.append((job, TokenEvent(r.index, token, text, lp, top, finish)))
            finished.append(finish is not None)
        if self.metrics is not None:
            self.metrics.generated_tokens(len(rows))
        return finished

    def _score(self, jobs: list[Job]) -> None:
        """Prompt log-probs through the shared scorer, one left-padded batch."""
        k = max(j.prompt_logprobs for j in jobs)
        longest = max(len(j.prompt) for j in jobs) - 1
        if longest > 0:
            ids = torch.full((len(jobs), longest), self.filler, dtype=torch.long)
            targets = torch.full((len(jobs), longest), IGNORE_INDEX, dtype=torch.long)
            pads = [longest - (len(j.prompt) - 1) for j in jobs]
            for b, j in enumerate(jobs):
                if len(j.prompt) > 1:
                    ids[b, pads[b]:] = torch.tensor(j.prompt[:-1])
                    targets[b, pads[b]:] = torch.tensor(j.prompt[1:])
            pad_lens = torch.tensor(pads, device=self.device) if any(pads) else None
            self._select([j.adapter for j in jobs])
            st = token_stats(self.model, ids.to(self.device), targets.to(self.device), top_k=k, pad_lens=pad_lens,
                             vocab_limit=self.vocab)
            lps = st.logprobs.tolist()
            top_ids = st.top_ids.tolist() if k else None
            top_lps = st.top_logprobs.tolist() if k else None
        for b, j in enumerate(jobs):
            values: list[float | None] = [None]
            tops: list | None = [None] if j.prompt_logprobs else None
            if len(j.prompt) > 1:
                p = pads[b]
                values += lps[b][p:]
                if tops is not None:
                    kj = j.prompt_logprobs
                    tops += [list(zip(i[:kj], v[:kj])) for i, v in zip(top_ids[b][p:], top_lps[b][p:])]
            self._outbox.append((j, PromptEvent(j.base_index, values, tops)))
        if self.metrics is not None:  # generating jobs count theirs at their prefill
            self.metrics.prompt_tokens(sum(len(j.prompt) for j in jobs if not j.generate))

    def _flush(self) -> None:
        if not self._outbox:
            return
        by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list]] = {}
        for job, event in self._outbox:
            by_loop.setdefault(id(job.loop), (job.loop, []))[1].append((job.queue, event))
        self._outbox = []
        for loop, items in by_loop.values():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that loop is closed: nobody is listening any more
                pass


def _deliver(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)
