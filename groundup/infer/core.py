"""The engine core: requests join and leave one running batch, over a paged KV cache with prefix caching.

    core = EngineCore(model, tokenizer, max_batch=16)
    core.add(Request(prompt_ids, SamplingConfig(max_new_tokens=32, temperature=0), seeds=[0, 1]))
    while core.has_work():
        for event in core.step():          # a TokenEvent per new token per choice, the last with finish_reason
            ...
    core.abort(request)                    # its sequences leave and free their blocks at the next step

vLLM's shape: this core admits, steps and samples; a synchronous driver (engine.Generator) serves
`generate`, `chat`, evaluation and sampling for training, and the server drives the same core from its
own thread (serve/scheduler.py). Each `step`:

1. aborted requests leave, their blocks released at once;
2. waiting sequences are admitted while the batch has room, the pool has the blocks their tokens need
   and the step's prefill budget allows (at least one): full blocks of a prefix already cached are
   shared, not prefilled (kv_blocks.py); the rest is prefilled in groups of similar length, and each
   sequence samples from the logits after its last token. A request's n choices share its prompt's
   blocks (each copies the partial last one) and its first logits;
3. one decode step (paged_decode.py) on every running sequence (with a speculator, speculative.py: a
   verification of each sequence's proposed tokens, 1 to k + 1 tokens each); when one needs a new block and none
   is free, the newest sequence is preempted: its blocks are released and it waits, first in line, to
   be prefilled again with its tokens so far (the prefix cache usually still holds most of them);
4. sequences that finished leave; every full block they filled stays in the prefix cache.

Every sequence samples with its own `Sampler` (seeded by its choice's seed) and ends in its own
`TextStream` (stop tokens and strings, UTF-8 held back), so a sequence decodes as it would alone: the
same tokens whatever else shares the batch, up to float rounding between batch shapes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque

import torch

from groundup.errors import GroundupError
from groundup.infer.kv_blocks import BlockPool, KVPages, block_hashes, layout
from groundup.infer.paged_decode import DecodeStep
from groundup.infer.requests import ErrorEvent, PromptEvent, Request, Sequence, TokenEvent
from groundup.infer.sampling import Sampler
from groundup.infer.speculative import speculative_decode
from groundup.infer.structured import Grammars
from groundup.infer.text_stream import TextStream
from groundup.model.heads import Logits
from groundup.model.logprobs import token_stats

class EngineCore:
    PAD_WASTE = 1.25  # a prefill group's padded positions stay within this factor of its real new ones

    def __init__(self, model, tokenizer, *, max_batch: int = 16, kv_blocks: int | None = None, block_size: int = 16,
                 max_prefill_tokens: int = 2048, compile: bool = False, bank=None, metrics=None,
                 prefix_caching: bool = True, speculator=None):
        """`kv_blocks`: the pool's size (default: every batch slot can hold a full context); `bank`: an
        adapter bank whose `select(indices)` routes each row through its adapter; `metrics`: counters
        (serve/metrics.py's interface); `prefix_caching`: share the blocks of equal prefixes (off: every
        prompt is prefilled whole); `speculator`: speculative decoding (speculative.py's Speculator)."""
        self.model, self.tok, self.bank, self.metrics = model, tokenizer, bank, metrics
        self.cfg = model.cfg
        self.device, self.dtype = model.device, model.dtype
        self.vocab = tokenizer.vocab_size
        self.stop_ids = frozenset(tokenizer.stop_ids)
        self.filler = tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eot_id or 0)
        self.max_batch, self.max_prefill_tokens, self.block_size = max_batch, max_prefill_tokens, block_size
        self.compile, self.decoder, self.prefix_caching = compile, None, prefix_caching
        self.grammars = None  # structured output's grammar engine, made on first use
        self.speculator = speculator
        if speculator is not None:
            speculator.check(self.cfg, self.vocab)
        per_sequence = math.ceil(self.cfg.max_seq_len / block_size)
        self._make_pool(kv_blocks or max_batch * per_sequence + 1)
        self.waiting: deque[Sequence | Request] = deque()
        self.running: list[Sequence] = []
        self.steps = 0  # decode steps
        self.preemptions = 0

    def _make_pool(self, blocks: int) -> None:
        self.pool = BlockPool(blocks, self.block_size)
        self.pages = KVPages(self.cfg, self.pool, self.device, self.dtype)
        if getattr(self, "decoder", None) is None:
            self.decoder = DecodeStep(self.model, self.pages, compile=self.compile)
        self.decoder.pages = self.pages  # a compiled step keeps its graph: the pool's size is a dynamic dimension

    def ensure_blocks(self, blocks: int) -> None:
        """Grow the pool to at least `blocks` while nothing runs (the synchronous driver sizes it per call)."""
        if blocks > self.pool.num_blocks and not self.has_work():
            self._make_pool(blocks)

    def clear_prefix_cache(self) -> None:
        """Forget every cached block (the model's weights changed: their K/V are stale)."""
        if self.has_work():
            raise RuntimeError("clear_prefix_cache while sequences run")
        self.pool = BlockPool(self.pool.num_blocks, self.block_size)
        self.pages.pool = self.pool

    # ------------------------------------------------------------------ the caller's side

    def add(self, request: Request) -> None:
        """Queue `request`; one asking for more choices than a batch holds runs as parts that share its id
        (each part prefilled and forked on its own), so the caller's events and routes stay one request's."""
        seeds = request.seeds or []
        if len(seeds) <= self.max_batch:
            self.waiting.append(request)
            return
        for start in range(0, len(seeds), self.max_batch):
            part = dataclasses.replace(request, seeds=seeds[start: start + self.max_batch], id=request.id,
                                       base_index=request.base_index + start, arrival=request.arrival)
            if start:
                part.prompt_logprobs = None  # the prompt is scored once
            self.waiting.append(part)

    def abort(self, request: Request) -> None:
        request.aborted = True
        for item in [*self.waiting, *self.running]:  # its parts too (see add)
            if _request(item).id == request.id:
                _request(item).aborted = True

    def abort_all(self) -> None:
        """Every request leaves now, its blocks released (a caller that stopped listening)."""
        for s in self.running:
            self._finish(s)
        self.running, self.waiting = [], deque()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    # ------------------------------------------------------------------ one step

    def step(self) -> list:
        """Admit, prefill, decode and sample once; the events of this step, in order."""
        events: list = []
        with torch.inference_mode():
            self._drop_aborted()
            decoding = list(self.running)  # not the admitted nor their forks: their first token comes from prefill
            admitted = self._admit(events)
            if admitted:
                self._prefill(admitted, events)
            decoding = [s for s in decoding if s.stream.finish_reason is None]
            if decoding and self.speculator is not None:
                speculative_decode(self, self.speculator, decoding, events)
            elif decoding:
                self._decode(decoding, events)
        self.running = [s for s in self.running if s.stream.finish_reason is None]
        return events

    def _drop_aborted(self) -> None:
        for s in [s for s in self.running if s.request.aborted]:
            self._finish(s)
        self.running = [s for s in self.running if not s.request.aborted]
        self.waiting = deque(w for w in self.waiting if not _request(w).aborted)

    def _finish(self, s: Sequence) -> None:
        self.pool.release(s.blocks)
        s.blocks = []
        if s.stream.finish_reason is None:
            s.stream.finish_reason = "abort"
            if self.metrics is not None:
                self.metrics.aborted()

    # ------------------------------------------------------------------ admission and prefill

    def _admit(self, events: list) -> list[Sequence]:
        """Waiting sequences that fit the batch, the pool and the prefill budget (at least one)."""
        admitted, budget = [], self.max_prefill_tokens
        while self.waiting:
            item = self.waiting[0]
            if isinstance(item, Request):
                if item.prompt_logprobs is not None:
                    self._score_prompt(item, events)
                    item.prompt_logprobs = None
                if not item.generate:
                    self.waiting.popleft()
                    events += [TokenEvent(item, item.base_index + i, None, "", finish_reason="length")
                               for i in range(item.n)]
                    continue
                if len(item.prompt) >= self.cfg.max_seq_len:  # no room for one new token: it fails alone
                    self.waiting.popleft()
                    events.append(ErrorEvent(item, f"the prompt has {len(item.prompt)} tokens; the model's context "
                                                   f"is {self.cfg.max_seq_len}, which leaves none to generate"))
                    continue
                slots = item.n
            else:
                slots = 1
            forks = sum(s.request.n - 1 for s in admitted)  # made during this step's prefill
            if len(self.running) + forks + slots > self.max_batch:
                break
            try:
                seq = item if isinstance(item, Sequence) else self._first_sequence(item)
            except GroundupError as e:  # a grammar the engine cannot compile: this request fails alone
                self.waiting.popleft()
                events.append(ErrorEvent(item, str(e)))
                continue
            need = self._claim(seq, extra=slots - 1)
            if need is None and not self.running:  # nothing will free blocks: it can never run
                self.waiting.popleft()
                blocks = math.ceil(len(seq.tokens) / self.block_size) + slots - 1
                events.append(ErrorEvent(seq.request, f"the prompt needs {blocks} KV blocks of "
                                                      f"{self.block_size} tokens; the pool has {self.pool.num_blocks - 1}"))
                continue
            if need is None or (admitted and need > budget):
                if need is not None:
                    self._unclaim(seq)
                break
            self.waiting.popleft()
            admitted.append(seq)
            self.running.append(seq)
            budget -= need
            if self.metrics is not None:  # vLLM's counts: the tokens looked up, those found cached
                self.metrics.prefix_cache(queries=len(seq.tokens), hits=seq.cached)
        return admitted

    def _first_sequence(self, request: Request) -> Sequence:
        return self._sequence(request, 0)

    def _sequence(self, request: Request, i: int) -> Sequence:
        seeds = request.seeds or [request.sampling.seed]
        cfg = dataclasses.replace(request.sampling, seed=seeds[i])
        stops = self.stop_ids if request.stop_ids is None else request.stop_ids
        max_new = min(cfg.max_new_tokens, self.cfg.max_seq_len - len(request.prompt))
        seq = Sequence(request, request.base_index + i, Sampler(cfg, [request.prompt], self.vocab, self.device),
                       TextStream(self.tok, stops, cfg.stop, cfg.skip_special_tokens), max_new)
        if cfg.structured is not None:
            if self.grammars is None:
                self.grammars = Grammars(self.tok, self.cfg.vocab_size, self.tok.eot_id)
            seq.matcher = self.grammars.matcher(cfg.structured)
        return seq

    def _claim(self, seq: Sequence, extra: int = 0) -> int | None:
        """Give `seq` blocks for all its tokens (cached ones shared); the tokens left to prefill, or None
        (nothing claimed) when the pool cannot hold them plus `extra` blocks (its forks' partial blocks)."""
        size = self.block_size
        seq.keys = block_hashes(seq.tokens, size, self._cache_key(seq.request))
        usable = (len(seq.tokens) - 1) // size  # the last token is always computed: its logits are needed
        shared = self.pool.cached_prefix(seq.keys[:usable]) if self.prefix_caching else []
        fresh = self.pool.allocate(math.ceil(len(seq.tokens) / size) - len(shared) + extra)
        if fresh is None:
            self.pool.release(shared)
            return None
        seq.spare = fresh[len(fresh) - extra:]  # for its forks' partial last blocks
        fresh = fresh[: len(fresh) - extra]
        seq.blocks, seq.cached, seq.registered = shared + fresh, len(shared) * size, len(shared)
        return len(seq.tokens) - seq.cached

    def _unclaim(self, seq: Sequence) -> None:
        self.pool.release(seq.blocks + seq.spare)
        seq.blocks, seq.spare, seq.cached = [], [], 0

    def _prefill(self, seqs: list[Sequence], events: list) -> None:
        if self.metrics is not None:
            self.metrics.prefilled(sum(len(s.tokens) - s.cached for s in seqs))
        groups: list[list[Sequence]] = []  # by new tokens, so padding wastes little
        for s in sorted(seqs, key=lambda s: len(s.tokens) - s.cached):
            if groups and self._fits(groups[-1], s):
                groups[-1].append(s)
            else:
                groups.append([s])
        for group in groups:
            logits = self._forward(group)
            for s in group:
                s.cached = len(s.tokens)
                self._register(s)
            forks = []
            for b, s in enumerate(group):
                if s.count == 0 and s.index == s.request.base_index:
                    forks += [(b, self._fork(s, i)) for i in range(1, s.request.n)]
                self.pool.release(s.spare)  # a partial block copied per fork; none when the prompt fills whole blocks
                s.spare = []
            rows = group + [f for _, f in forks]
            source = list(range(len(group))) + [b for b, _ in forks]
            if forks:
                logits = logits[torch.tensor(source, device=logits.device)]
            self._sample(rows, logits, events)
        if self.decoder is not None:  # prefill (and forks) wrote pages: a block a finished row held may be reused
            self.decoder.invalidate()  # under an equal block table, so the step must gather again

    def _fits(self, group: list[Sequence], s: Sequence) -> bool:
        new = len(s.tokens) - s.cached  # at least every new count in `group`
        padded = (len(group) + 1) * new
        real = sum(len(g.tokens) - g.cached for g in group) + new
        return padded <= self.PAD_WASTE * real and padded <= self.max_prefill_tokens

    def _forward(self, group: list[Sequence]) -> torch.Tensor:
        """One forward over each sequence's uncached tokens; the logits (B, V) after its last token."""
        n_new = max(len(s.tokens) - s.cached for s in group)
        ids = torch.full((len(group), n_new), self.filler, dtype=torch.long)
        for b, s in enumerate(group):
            window = s.tokens[max(0, len(s.tokens) - n_new):]
            ids[b, n_new - len(window):] = torch.tensor(window, dtype=torch.long)
        view = layout(self.pages, [(s.blocks, len(s.tokens), s.cached) for s in group], n_new, self.device)
        self._select([s.request.adapter for s in group])
        return self.model(ids.to(self.device), head=Logits(last_only=True), cache=view).logits[:, -1]

    def _fork(self, parent: Sequence, i: int) -> Sequence:
        """Choice i of the parent's request: the parent's full blocks shared, its partial block copied."""
        child = self._sequence(parent.request, i)
        size, full = self.block_size, len(parent.tokens) // self.block_size
        child.blocks = self.pool.share(parent.blocks[:full])
        if len(parent.tokens) % size:
            block = parent.spare.pop()  # claimed with the parent at admission
            self.pages.copy_block(parent.blocks[full], block, len(parent.tokens) % size)
            child.blocks.append(block)
        child.keys, child.registered, child.cached = list(parent.keys), parent.registered, parent.cached
        self.running.append(child)
        return child

    def _register(self, s: Sequence) -> None:
        """Offer each newly filled block to the prefix cache."""
        if not self.prefix_caching:
            return
        size = self.block_size
        while len(s.keys) < s.cached // size:  # keys of blocks filled by generated tokens
            parent = s.keys[-1] if s.keys else hash(("groundup-kv", self._cache_key(s.request)))
            start = len(s.keys) * size
            s.keys.append(hash((parent, tuple(s.tokens[start : start + size]))))
        while s.registered < s.cached // size:
            self.pool.register(s.blocks[s.registered], s.keys[s.registered])
            s.registered += 1

    # ------------------------------------------------------------------ decode

    def _decode(self, seqs: list[Sequence], events: list) -> None:
        seqs = self._make_room(seqs, events)
        if seqs:
            self._decode_step(seqs, events)

    def _decode_step(self, seqs: list[Sequence], events: list) -> None:
        """One token per sequence through the decode step (each has the block its next K/V goes to)."""
        size = self.block_size
        n_blocks = max(len(s.blocks) for s in seqs)
        tables = torch.zeros(len(seqs), n_blocks, dtype=torch.long)  # padded with the null block
        for b, s in enumerate(seqs):
            tables[b, : len(s.blocks)] = torch.tensor(s.blocks, dtype=torch.long)
        dev = self.device
        last = [len(s.tokens) - 1 for s in seqs]
        tokens = torch.tensor([[s.tokens[-1]] for s in seqs], dtype=torch.long, device=dev)
        writes = [s.blocks[p // size] * size + p % size for s, p in zip(seqs, last)]
        self._select([s.request.adapter for s in seqs])
        logits = self.decoder(tokens, torch.tensor(last, dtype=torch.long, device=dev), tables.to(dev),
                              torch.tensor(writes, dtype=torch.long, device=dev),
                              last[0] if len(set(last)) == 1 else None)
        self.steps += 1
        if self.metrics is not None:
            self.metrics.decode_step(len(seqs))
        for s in seqs:
            s.cached = len(s.tokens)
            if s.cached % size == 0:
                self._register(s)
        self._sample(seqs, logits, events)

    def _make_room(self, seqs: list[Sequence], events: list) -> list[Sequence]:
        """A block for each sequence whose next token starts one; preempting the newest when none is free."""
        size = self.block_size
        order = sorted(seqs, key=lambda s: (s.request.arrival, s.index))
        for s in order:
            if s not in self.running:
                continue
            while (len(s.tokens) - 1) // size >= len(s.blocks):
                block = self.pool.allocate(1)
                if block is not None:
                    s.blocks += block
                    continue
                if len(self.running) == 1:  # alone and the pool is full: it can grow no further
                    tail = s.stream.finish("length")
                    self._finished(s, "length", time.perf_counter())
                    self._finish(s)
                    self.running.remove(s)
                    events.append(TokenEvent(s.request, s.index, None, tail, finish_reason="length"))
                    break
                victim = max((r for r in self.running), key=lambda r: (r.request.arrival, r.index))
                self._preempt(victim)
                if victim is s:
                    break
        return [s for s in seqs if s in self.running]

    def _preempt(self, s: Sequence) -> None:
        self.pool.release(s.blocks)
        s.blocks, s.cached, s.registered = [], 0, 0
        self.running.remove(s)
        self.waiting.appendleft(s)
        self.preemptions += 1
        if self.metrics is not None:
            self.metrics.preempted()

    # ------------------------------------------------------------------ sampling

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor, events: list) -> None:
        """Each sequence's next token from its row of `logits`: appended, pushed to its stream, reported."""
        raw = logits
        if any(s.matcher is not None for s in seqs):  # what the grammar does not allow is never sampled
            logits = logits.clone() if any(s.wants_scores for s in seqs) else logits  # log-probs stay the model's
            for b, s in enumerate(seqs):
                if s.matcher is not None:
                    s.matcher.mask(logits[b])
        picked = _pick(seqs, logits)
        now = time.perf_counter()
        for b, (s, token) in enumerate(zip(seqs, picked)):
            if s.matcher is not None:
                token = s.matcher.settle(token, s.max_new - s.count)  # JSON closes before max_tokens cuts it
                s.matcher.accept(token)
            self.emit(s, token, raw[b : b + 1] if s.wants_scores else None, events, now)
        if self.metrics is not None:
            self.metrics.generated_tokens(len(seqs))

    def emit(self, s: Sequence, token: int, scores_from: torch.Tensor | None, events: list, now: float) -> bool:
        """Append one sampled token to `s`: its text, its scores (from `scores_from`, the raw logits row),
        its event; True when it ended the sequence (its blocks are then released)."""
        lp = top = entropy = None
        if scores_from is not None:
            lp, top, entropy = s.sampler.scores(scores_from, torch.tensor([token], device=scores_from.device))[0]
        r = s.request
        if r.first_token_at is None:
            r.first_token_at = now
            if self.metrics is not None:
                self.metrics.first_token(now - r.arrival, len(r.prompt))
        if s.last_at is None:
            s.first_at = now
        elif now > s.last_at and self.metrics is not None:  # once a step (speculation emits several at once)
            self.metrics.inter_token(now - s.last_at)
        s.last_at = now
        s.tokens.append(token)
        s.count += 1
        text = s.stream.push(token)
        finish = None
        if s.stream.done:
            finish = "stop"
        elif s.count >= s.max_new:
            text += s.stream.finish("length")
            finish = "length"
        if finish is not None:
            s.stream.finish_reason = finish
            self.pool.release(s.blocks)
            s.blocks = []
            self._finished(s, finish, now)
        events.append(TokenEvent(r, s.index, token, text, lp, top, entropy, finish))
        return finish is not None

    def _finished(self, s: Sequence, reason: str, now: float) -> None:
        if self.metrics is not None:
            decoding = now - s.first_at if s.first_at is not None else 0.0
            self.metrics.finished(reason, now - s.request.arrival, len(s.request.prompt), s.count, decoding)

    # ------------------------------------------------------------------ adapters and prompt scores

    def _select(self, adapters: list[int]) -> None:
        if self.bank is not None:
            self.bank.select(adapters)

    def _cache_key(self, r: Request) -> int:
        """What the request's prefix-cache keys chain from: its adapter, as the bank names the one loaded
        now (an index reused by a later load gets a new key, so blocks cached for the old adapter never match)."""
        cache_key = getattr(self.bank, "cache_key", None)
        return cache_key(r.adapter) if cache_key is not None and r.adapter else r.adapter

    def _score_prompt(self, r: Request, events: list) -> None:
        """The prompt's log-probs through the shared scorer (`echo` with `logprobs`)."""
        k, p = r.prompt_logprobs, r.prompt
        values: list[float | None] = [None]
        tops: list | None = [None] if k else None
        if len(p) > 1:
            self._select([r.adapter])
            ids = torch.tensor([p[:-1]], device=self.device)
            targets = torch.tensor([p[1:]], device=self.device)
            st = token_stats(self.model, ids, targets, top_k=k, vocab_limit=self.vocab)
            values += st.logprobs[0].tolist()
            if k:
                tops += [list(zip(i, v)) for i, v in zip(st.top_ids[0].tolist(), st.top_logprobs[0].tolist())]
        events.append(PromptEvent(r, values, tops))
        if self.metrics is not None and not r.generate:
            self.metrics.prompt_tokens(len(p))


def _request(item) -> Request:
    return item if isinstance(item, Request) else item.request


def _pick(seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
    """Each row's token: greedy rows without a penalty in one argmax, the others by their own sampler."""
    plain = [b for b, s in enumerate(seqs) if s.sampler.cfg.greedy and s.sampler.seen is None]
    out: list[int | None] = [None] * len(seqs)
    if plain:
        rows = logits if len(plain) == len(seqs) else logits[torch.tensor(plain, device=logits.device)]
        for b, t in zip(plain, rows[:, : seqs[0].sampler.vocab_size].argmax(dim=-1).tolist()):
            out[b] = t
    for b, s in enumerate(seqs):
        if out[b] is None:
            out[b] = int(s.sampler(logits[b : b + 1])[0])
    return out
