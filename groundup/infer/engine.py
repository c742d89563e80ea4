"""The synchronous driver of the one engine: a checkpoint and its tokenizer in, text out (batched, streamed).

    gen = Generator.from_checkpoint("out/model", device="cpu", dtype="float32")
    gen.generate(["To be, or", "def main("], max_new_tokens=64, temperature=0.8, top_p=0.95, seed=1)
    for piece in gen.stream("Once upon a time", max_new_tokens=64):
        print(piece, end="", flush=True)
    for piece in gen.chat([{"role": "user", "content": "What is 2+3?"}]):
        ...

Every call hands its prompts to the engine core (core.py: continuous batching over the paged KV
cache, prefix caching) as requests and steps it until they are done: `generate`, `chat`, evaluation,
GRPO and RFT sampling and `data pairs` all run here, and the server drives the same core from its
thread. Row i of a call samples with seed `seed + i`, so a row decodes exactly as it would alone
(the same prompt with that seed gives the same tokens), and equal prompts in one call are one
request with several choices: the prompt is prefilled once. A row stops at end-of-text, end-of-turn
or one of the caller's stop strings, or after `max_new_tokens`.

The prefix cache lives as long as the Generator, and is cleared when the model's weights changed
since the last call (a training step between two GRPO samplings): cached K/V is only reused for the
weights that computed it.

Prompts are encoded by prompts.PromptEncoder, the path the server takes too: a plain prompt after the
tokenizer's prefix (groundup's end-of-text, the context every training document starts in), with
special-token spellings read as those tokens; a chat rendered by the tokenizer's chat format.

Context: `max_new_tokens` is capped by the room the model's context leaves after the prompt. A
prompt that leaves no room is an error, or with `overflow="truncate"` loses tokens from its start
until the requested new tokens fit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from groundup.errors import CheckpointError, DataError
from groundup.infer.core import EngineCore, ErrorEvent, Request, TokenEvent
from groundup.infer.prompts import PromptEncoder
from groundup.infer.sampling import SamplingConfig
from groundup.loading import load_for_inference
from groundup.model.transformer import Transformer


@dataclass
class Completion:
    text: str  # the generated text, cut before a stop string; special tokens are not shown
    token_ids: list[int]  # generated ids, ending with the stop token if one ended the row
    finish_reason: str  # "stop" (end of text / turn, stop string) or "length" (token limit or context)
    prompt_tokens: int  # after truncation
    logprobs: list[float] | None = None  # with SamplingConfig.logprobs: log p of each id in token_ids
    top_logprobs: list[list[tuple[int, float]]] | None = None  # with top_logprobs = k: the k likeliest per step
    entropies: list[float] | None = None  # with SamplingConfig.logprobs: the entropy of each step's distribution


class Generator:
    def __init__(self, model: Transformer, tokenizer, compile: bool = False, block_size: int = 16, speculator=None):
        """`compile`: decode through a torch.compile'd step (paged_decode.py; about a minute of compiling
        once, then ~2x faster decoding on CPU). `speculator`: speculative decoding (speculative.py). The model's train/eval mode is left as it is: each
        generation runs in eval mode and restores the mode it found (GRPO samples from the policy it
        trains)."""
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = model.cfg
        self.device = model.device
        self.dtype = model.dtype
        if tokenizer.vocab_size > self.cfg.vocab_size:
            raise CheckpointError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                                  f"{self.cfg.vocab_size}: they were not trained together")
        self.stop_ids = set(tokenizer.stop_ids)
        self.prompt_prefix = list(tokenizer.prefix_ids)  # what the tokenizer puts before a document
        self.prompts = PromptEncoder(tokenizer)  # the one prompt path (the server's too)
        self.core = EngineCore(model, tokenizer, max_batch=1, kv_blocks=2, block_size=block_size, compile=compile,
                               speculator=speculator)
        self._weights = None  # the weights' versions when the prefix cache was filled

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu",
                        dtype: str | torch.dtype = "float32", compile: bool = False,
                        tokenizer: str | Path | None = None, adapter: str | Path | None = None) -> "Generator":
        """A model directory (MODEL/tokenizer beside it) or a training run (its latest checkpoint and
        RUN/tokenizer); `tokenizer` overrides where the tokenizer is found; `adapter` adds a LoRA adapter
        (merged: decoding runs at the base model's speed)."""

        model, tok = load_for_inference(path, device, dtype, tokenizer, adapter=adapter, merge=adapter is not None)
        return cls(model, tok, compile=compile)

    # ------------------------------------------------------------------ public API

    def generate(self, prompts: Sequence[str] | str, sampling: SamplingConfig | None = None, **options) -> list[str]:
        """Completions of `prompts` (texts only); options are SamplingConfig fields."""
        return [c.text for c in self.complete(prompts, sampling, **options)]

    def complete(self, prompts: Sequence[str] | str, sampling: SamplingConfig | None = None,
                 **options) -> list[Completion]:
        """Like `generate`, with token ids, finish reasons and prompt lengths."""
        cfg = SamplingConfig.make(sampling, **options)
        rows = self.encode_prompts(prompts, cfg)
        return self.complete_ids(rows, cfg)

    def complete_ids(self, rows: Sequence[Sequence[int]], sampling: SamplingConfig | None = None, *,
                     seeds: Sequence[int] | None = None, **options) -> list[Completion]:
        """`complete` for prompts given as token ids (used as they are: no prefix is added). `seeds`: one per
        row, in place of `seed + i` (the tool loop keeps each conversation's seeds its own, whichever rows
        are still running)."""
        cfg = SamplingConfig.make(sampling, **options)
        if seeds is not None and len(seeds) != len(rows):
            raise ValueError(f"complete_ids: {len(seeds)} seeds for {len(rows)} rows")
        rows = [self.fit(list(r), cfg, i) for i, r in enumerate(rows)]
        out = [Completion("", [], "length", len(r)) for r in rows]
        if cfg.logprobs:
            for c in out:
                c.logprobs, c.entropies = [], []
                c.top_logprobs = [] if cfg.top_logprobs else None
        for events in self._run(rows, cfg, seeds=seeds):
            for b, e in events:
                c = out[b]
                c.text += e.text
                if e.token is not None:
                    c.token_ids.append(e.token)
                    if cfg.logprobs:
                        c.logprobs.append(e.logprob)
                        c.entropies.append(e.entropy)
                        if cfg.top_logprobs:
                            c.top_logprobs.append(e.top)
                if e.finish_reason is not None:
                    c.finish_reason = e.finish_reason
        return out

    def stream(self, prompt: str, sampling: SamplingConfig | None = None, **options) -> Iterator[str]:
        """Text pieces of one completion as tokens arrive; they concatenate to `generate`'s text."""
        cfg = SamplingConfig.make(sampling, **options)
        return self._stream_one(self.encode_prompts([prompt], cfg), cfg)

    def stream_batch(self, prompts: Sequence[str], sampling: SamplingConfig | None = None,
                     **options) -> Iterator[list[str]]:
        """Per step, the new text of every row ('' for a row with nothing new or already done)."""
        cfg = SamplingConfig.make(sampling, **options)
        rows = self.encode_prompts(prompts, cfg)
        for events in self._run(rows, cfg):
            deltas = [""] * len(rows)
            for b, e in events:
                deltas[b] += e.text
            yield deltas

    def chat(self, messages: Sequence[dict], sampling: SamplingConfig | None = None, **options) -> Iterator[str]:
        """The assistant's reply to a conversation, streamed; it ends at end-of-turn."""
        cfg = SamplingConfig.make(sampling, **options)
        return self._stream_one([self.fit(self.prompts.chat(messages), cfg)], cfg)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig | None = None,
                     stop_ids: Sequence[int] | None = None, **options) -> list[list[int]]:
        """Token level: new ids per prompt, each row ending at a stop id (default: end of text or
        turn; pass () to always generate max_new_tokens). No prefix is added to the prompts."""
        cfg = SamplingConfig.make(sampling, **options)
        rows = [self.fit(list(ids), cfg, i) for i, ids in enumerate(prompt_ids)]
        out: list[list[int]] = [[] for _ in rows]
        stops = None if stop_ids is None else frozenset(stop_ids)
        for events in self._run(rows, dataclasses.replace(cfg, stop=[]), stops):
            for b, e in events:
                if e.token is not None:
                    out[b].append(e.token)
        return out

    # ------------------------------------------------------------------ prompts and context

    def encode_prompts(self, prompts: Sequence[str] | str, cfg: SamplingConfig) -> list[list[int]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if not prompts:
            raise DataError("no prompts to complete")
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise DataError(f"prompt {i}: expected a string, got {type(p).__name__}")
        return [self.fit(ids, cfg, i) for i, ids in enumerate(self.prompts.encode_batch(prompts))]

    def fit(self, ids: list[int], cfg: SamplingConfig, index: int = 0) -> list[int]:
        """Apply the overflow policy to one prompt's ids."""
        context = self.cfg.max_seq_len
        if len(ids) + cfg.max_new_tokens <= context:
            return ids
        if cfg.overflow == "truncate":
            return ids[-max(1, context - cfg.max_new_tokens):]
        if len(ids) >= context:
            raise DataError(f"prompt {index} is {len(ids)} tokens but the model's context is {context}: "
                            "shorten it, or ask for left truncation (--truncate, overflow='truncate')")
        return ids  # generation stops when the context is full

    # ------------------------------------------------------------------ driving the core

    def _stream_one(self, rows: list[list[int]], cfg: SamplingConfig) -> Iterator[str]:
        for events in self._run(rows, cfg):
            piece = "".join(e.text for _, e in events)
            if piece:
                yield piece

    def _run(self, rows: list[list[int]], cfg: SamplingConfig,
             stop_ids: frozenset[int] | None = None,
             seeds: Sequence[int] | None = None) -> Iterator[list[tuple[int, TokenEvent]]]:
        """Per engine step, (row, event) of every row that moved; equal prompts are one request. The
        model runs in eval mode; the caller's mode is restored."""
        core = self.core
        if core.has_work():
            raise RuntimeError("a Generator runs one call at a time (finish or close the last stream first)")
        groups: dict[tuple[int, ...], list[int]] = {}
        for b, r in enumerate(rows):
            groups.setdefault(tuple(r), []).append(b)
        size = core.block_size
        need = sum(math.ceil(min(len(r) + cfg.max_new_tokens, self.cfg.max_seq_len) / size) + 1 for r in rows)
        core.max_batch = max(len(rows), 1)
        core.max_prefill_tokens = min(max(sum(map(len, rows)), 1), 1 << 16)  # a batch call prefills at once
        core.ensure_blocks(need + 1)
        weights = tuple(p._version for p in self.model.parameters())
        if weights != self._weights:
            core.clear_prefix_cache()
            self._weights = weights
        where: dict[tuple[int, int], int] = {}
        for ids, members in groups.items():
            request = Request(list(ids), cfg, seeds=[cfg.seed + b if seeds is None else seeds[b] for b in members],
                              stop_ids=frozenset(self.stop_ids) if stop_ids is None else stop_ids)
            for i, b in enumerate(members):
                where[(request.id, i)] = b
            core.add(request)
        was_training = self.model.training
        self.model.eval()
        try:
            while core.has_work():
                events = core.step()
                moved = []
                for e in events:
                    if isinstance(e, ErrorEvent):
                        raise DataError(e.message)
                    moved.append((where[(e.request.id, e.index)], e))
                if moved:
                    yield moved
        finally:
            self.model.train(was_training)
            core.abort_all()  # an abandoned stream or an error leaves nothing running
