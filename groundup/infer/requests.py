"""What goes into the engine core and what comes out: requests, the events of a step, and the sequences (one
per choice) the core runs. Callers build `Request`s and read `TokenEvent`, `ErrorEvent` and `PromptEvent`s;
`Sequence` is the core's own record of a running choice."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from groundup.infer.sampling import Sampler, SamplingConfig
from groundup.infer.text_stream import TextStream

_ids = itertools.count()


@dataclass(eq=False)
class Request:
    prompt: list[int]
    sampling: SamplingConfig  # max_new_tokens, sampling, stop strings, logprobs / top_logprobs
    seeds: list[int] | None = None  # one per choice (n = len(seeds)); default [sampling.seed]
    adapter: int = 0  # the adapter bank's index; 0 = the base model
    stop_ids: frozenset[int] | None = None  # the tokens that end a choice; None: the tokenizer's; () none
    prompt_logprobs: int | None = None  # also score the prompt: top-k per position (0 = each token's own)
    generate: bool = True  # False: score the prompt only (max_tokens 0)
    base_index: int = 0  # choice i is reported as base_index + i
    tag: object = None  # the caller's handle (the server's job)
    id: int = field(default_factory=lambda: next(_ids))
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    aborted: bool = False

    @property
    def n(self) -> int:
        return len(self.seeds) if self.seeds else 1


@dataclass
class TokenEvent:
    request: Request
    index: int  # choice index (base_index + i)
    token: int | None  # None: no new token (the held-back tail of a stopped choice, or nothing generated)
    text: str  # the text that became final with this token
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    entropy: float | None = None
    finish_reason: str | None = None  # on a choice's last event: "stop" or "length"


@dataclass
class ErrorEvent:
    """A request that cannot run (its tokens need more KV blocks than the whole pool has)."""

    request: Request
    message: str


@dataclass
class PromptEvent:
    """Log-probs of the prompt's tokens (None for the first); `top` per position, or None."""

    request: Request
    logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None] | None

    @property
    def base_index(self) -> int:
        return self.request.base_index


class Sequence:
    """One choice of a request: its tokens, its blocks, its sampler and its text."""

    def __init__(self, request: Request, index: int, sampler: Sampler, stream: TextStream, max_new: int):
        self.request, self.index, self.sampler, self.stream, self.max_new = request, index, sampler, stream, max_new
        self.tokens = list(request.prompt)
        self.blocks: list[int] = []
        self.spare: list[int] = []  # blocks claimed for the request's other choices (see EngineCore._fork)
        self.keys: list[int] = []  # prefix keys of its full blocks, in order
        self.registered = 0  # full blocks offered to the prefix cache
        self.cached = 0  # positions whose K/V are in its blocks
        self.count = 0  # generated tokens
        self.first_at = self.last_at = None  # when its first and its latest tokens were sampled (perf_counter)
        self.matcher = None  # structured output: where the sequence is in its grammar

    @property
    def wants_scores(self) -> bool:
        return self.sampler.cfg.logprobs
