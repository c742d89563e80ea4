"""The generation engine: a checkpoint and its tokenizer in, text out (batched, streamed or both).

    gen = Generator.from_checkpoint("out/model", device="cpu", dtype="float32")
    gen.generate(["To be, or", "def main("], max_new_tokens=64, temperature=0.8, top_p=0.95, seed=1)
    for piece in gen.stream("Once upon a time", max_new_tokens=64):
        print(piece, end="", flush=True)
    for piece in gen.chat([{"role": "user", "content": "What is 2+3?"}]):
        ...

A batch of prompts is left-padded to its longest prompt and decoded in lockstep: one prefill over
the whole batch into a preallocated KV cache, then one token per row per step (padding is masked
and RoPE positions start at each row's first real token, so a row decodes exactly as it would
alone). A row stops at end-of-text, end-of-turn or one of the caller's stop strings; the batch
stops when every row has, or after `max_new_tokens`.

A plain prompt is encoded after the end-of-text id, the context every training document starts in
(token shards separate documents with it); a chat is rendered by the tokenizer's chat format.

Context: `max_new_tokens` is capped by the room the model's context leaves after the prompt. A
prompt that leaves no room is an error, or with `overflow="truncate"` loses tokens from its start
until the requested new tokens fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from groundup.errors import CheckpointError, DataError
from groundup.infer.sampling import Sampler, SamplingConfig
from groundup.infer.static_decode import StaticDecoder
from groundup.infer.text_stream import TextStream
from groundup.loading import load_for_inference
from groundup.model.heads import Logits
from groundup.model.kv_cache import KVCache
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
    def __init__(self, model: Transformer, tokenizer, compile: bool = False):
        """`compile`: decode through a torch.compile'd step (see static_decode; ~2x faster decoding here
        after about a minute of compiling per batch size). The model's train/eval mode is left as it is:
        each generation runs in eval mode and restores the mode it found (GRPO samples from the policy
        it trains)."""
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
        self.static = StaticDecoder(model) if compile else None

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

    def complete_ids(self, rows: Sequence[Sequence[int]], sampling: SamplingConfig | None = None,
                     **options) -> list[Completion]:
        """`complete` for prompts given as token ids (used as they are: no prefix is added)."""
        cfg = SamplingConfig.make(sampling, **options)
        rows = [self.fit(list(r), cfg, i) for i, r in enumerate(rows)]
        streams = self._streams(len(rows), cfg)
        scores: list[list] | None = [[] for _ in rows] if cfg.logprobs else None
        for _ in self._stream_rows(rows, cfg, streams, scores):
            pass
        out = []
        for b, (s, r) in enumerate(zip(streams, rows)):
            c = Completion(s.text, s.token_ids, s.finish_reason, len(r))
            if scores is not None:
                c.logprobs = [lp for lp, _, _ in scores[b]]
                c.top_logprobs = [top for _, top, _ in scores[b]] if cfg.top_logprobs else None
                c.entropies = [h for _, _, h in scores[b]]
            out.append(c)
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
        return self._stream_rows(rows, cfg, self._streams(len(rows), cfg))

    def chat(self, messages: Sequence[dict], sampling: SamplingConfig | None = None, **options) -> Iterator[str]:
        """The assistant's reply to a conversation, streamed; it ends at end-of-turn."""
        cfg = SamplingConfig.make(sampling, **options)
        ids, _ = self.tokenizer.render_chat(messages, add_generation_prompt=True)
        return self._stream_one([self.fit(ids, cfg)], cfg)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig | None = None,
                     stop_ids: Sequence[int] | None = None, **options) -> list[list[int]]:
        """Token level: new ids per prompt, each row ending at a stop id (default: end of text or
        turn; pass () to always generate max_new_tokens). No prefix is added to the prompts."""
        cfg = SamplingConfig.make(sampling, **options)
        rows = [self.fit(list(ids), cfg, i) for i, ids in enumerate(prompt_ids)]
        stops = self.stop_ids if stop_ids is None else set(stop_ids)
        out: list[list[int]] = [[] for _ in rows]
        done = [False] * len(rows)
        steps = self._token_steps(rows, cfg)
        try:
            for tokens, _ in steps:
                for b, t in enumerate(tokens):
                    if not done[b]:
                        out[b].append(t)
                        done[b] = t in stops
                if all(done):
                    break
        finally:
            steps.close()
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
        encoded = self.tokenizer.encode_batch(prompts)
        return [self.fit(self.prompt_prefix + ids, cfg, i) for i, ids in enumerate(encoded)]

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

    # ------------------------------------------------------------------ decoding

    def _streams(self, n: int, cfg: SamplingConfig) -> list[TextStream]:
        return [TextStream(self.tokenizer, self.stop_ids, cfg.stop) for _ in range(n)]

    def _stream_one(self, rows: list[list[int]], cfg: SamplingConfig) -> Iterator[str]:
        for deltas in self._stream_rows(rows, cfg, self._streams(1, cfg)):
            if deltas[0]:
                yield deltas[0]

    def _stream_rows(self, rows: list[list[int]], cfg: SamplingConfig, streams: list[TextStream],
                     scores: list[list] | None = None) -> Iterator[list[str]]:
        """Per step, each row's new text; `scores[b]` collects (log p, top-k) of each token row b keeps."""
        steps = self._token_steps(rows, cfg)
        try:
            for tokens, scored in steps:
                deltas = []
                for b, (s, t) in enumerate(zip(streams, tokens)):
                    if scores is not None and not s.done:
                        scores[b].append(scored[b])
                    deltas.append(s.push(t))
                yield deltas
                if all(s.done for s in streams):
                    break
        finally:
            steps.close()
        tail = [s.finish("length") for s in streams]
        if any(tail):
            yield tail

    def _token_steps(self, rows: list[list[int]], cfg: SamplingConfig) -> Iterator[tuple[list[int], list | None]]:
        """Each step, the next token of every row (and with cfg.logprobs, each row's (log p, top-k)):
        prefill once, then decode one token at a time, in eval mode (the caller's mode is restored)."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield from self._decode(rows, cfg)
        finally:
            self.model.train(was_training)

    def _decode(self, rows: list[list[int]], cfg: SamplingConfig) -> Iterator[tuple[list[int], list | None]]:
        longest = max(len(r) for r in rows)
        n_new = min(cfg.max_new_tokens, self.cfg.max_seq_len - longest)
        pad = [longest - len(r) for r in rows]
        filler = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else self.tokenizer.eot_id  # masked anyway
        ids = torch.full((len(rows), longest), filler, dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, pad[b]:] = torch.tensor(r, dtype=torch.long)
        ids = ids.to(self.device)
        pad_lens = torch.tensor(pad, device=self.device) if any(pad) else None
        sampler = Sampler(cfg, rows, self.tokenizer.vocab_size, self.device)
        if self.static is not None:
            cache = self.static.new_cache(len(rows), longest + n_new, pad_lens)
            step = self.static.step
        else:
            cache = KVCache(self.cfg, len(rows), longest + n_new, self.device, self.dtype, pad_lens)
            step = self._eager_step
        with torch.inference_mode():
            logits = self.model(ids, head=Logits(last_only=True), cache=cache).logits[:, -1]
            tokens = sampler(logits)
        for i in range(n_new):
            yield tokens.tolist(), sampler.scores(logits, tokens) if cfg.logprobs else None
            if i + 1 < n_new:
                with torch.inference_mode():
                    logits = step(tokens[:, None], cache)
                    tokens = sampler(logits)

    def _eager_step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        return self.model(tokens, cache=cache).logits[:, -1]
