"""Speculative decoding: cheap guesses at a sequence's next k tokens, checked by the target in one forward.

    spec = Speculator(SpeculativeConfig(method="ngram", num_tokens=4))            # prompt lookup
    spec = Speculator(SpeculativeConfig(method="draft", num_tokens=4), draft=small_model)
    core = EngineCore(model, tokenizer, speculator=spec)        # Generator(..., speculator=spec), serve --speculative-*

Each decode step, every eligible sequence gets up to k proposed tokens: prompt lookup (vLLM's `ngram`)
finds the latest earlier place where the sequence's last n tokens (n from `prompt_lookup_max` down to
`prompt_lookup_min`) occurred and proposes what followed them there; a draft model (any groundup model
over the same tokenizer, with its own small KV cache per sequence) decodes k tokens ahead. The target
then runs once over [last token, d1..dk] through the paged cache and keeps:

- greedy: the drafts up to the first one that is not the target's argmax, then the target's own token
  there (or a bonus token after all k): the same tokens plain greedy decoding gives;
- sampled: draft d_j with probability min(1, p(d_j) / q(d_j)) (p the target's distribution after
  temperature, top-k, top-p and min-p; q the draft's, one-hot for prompt lookup); at the first rejection,
  a token from the normalised residual max(p - q, 0); after all k, a bonus token from p. The tokens then
  follow the target's distribution exactly (Leviathan et al. 2023; Chen et al. 2023).

Every step thus yields 1 to k + 1 tokens per sequence. K/V written for rejected drafts lies past the
sequence's length and is overwritten later. Sequences that need every token's log-probs, a grammar or
a repetition penalty decode one token per step in the same forward (their distribution changes with
each token). `proposed` and `accepted` count draft tokens (acceptance rate = accepted / proposed).
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from groundup.config import fail
from groundup.errors import ConfigError
from groundup.infer.kv_blocks import layout
from groundup.infer.sampling import filtered_probs
from groundup.loading import load_for_inference
from groundup.model.heads import Logits
from groundup.model.kv_cache import KVCache

METHODS = ("ngram", "draft")


@dataclass
class SpeculativeConfig:
    method: str = "ngram"  # ngram (prompt lookup, no second model) or draft (a draft model)
    num_tokens: int = 4  # k: tokens proposed per step
    prompt_lookup_max: int = 4  # ngram: the longest suffix looked up
    prompt_lookup_min: int = 1  # ngram: the shortest

    def validate(self) -> None:
        if self.method not in METHODS:
            fail("speculative.method", self.method, f"one of {', '.join(METHODS)}")
        if not isinstance(self.num_tokens, int) or self.num_tokens < 1:
            fail("speculative.num_tokens", self.num_tokens, "an integer >= 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            fail("speculative.prompt_lookup_min", self.prompt_lookup_min, "1 <= prompt_lookup_min <= prompt_lookup_max")


def ngram_proposal(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the sequence's last n tokens."""
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(n_max, len(arr) - 1), n_min - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)  # every earlier n-gram
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return arr[start : start + k].tolist()
    return []


class _DraftState:
    def __init__(self, cache: KVCache):
        self.cache = cache  # the draft's K/V of the sequence's first `cache.pos` tokens


class Speculator:
    def __init__(self, cfg: SpeculativeConfig, draft=None):
        cfg.validate()
        if (cfg.method == "draft") != (draft is not None):
            fail("speculative.method", cfg.method, "'draft' together with a draft model (and only then)")
        self.cfg, self.draft = cfg, draft
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # sequence -> its draft cache
        self.proposed = self.accepted = 0

    def check(self, target_cfg, vocab: int) -> None:
        """The draft must read the target's tokens: a vocabulary at least the tokenizer's."""
        if self.draft is not None and self.draft.cfg.vocab_size < vocab:
            fail("speculative draft model", f"vocab_size {self.draft.cfg.vocab_size}",
                 f"a model over the target's tokenizer ({vocab} tokens)")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @staticmethod
    def eligible(s) -> bool:
        return s.matcher is None and not s.wants_scores and s.sampler.seen is None

    def propose(self, s, limit: int) -> tuple[list[int], torch.Tensor | None]:
        """Up to `limit` draft tokens for sequence `s`, and the draft's distributions (k, V) they were drawn
        from (None: prompt lookup, or greedy)."""
        k = min(self.cfg.num_tokens, limit)
        if k < 1:
            return [], None
        if self.draft is None:
            return ngram_proposal(s.tokens, k, self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max), None
        return self._draft(s, k)

    def _draft(self, s, k: int) -> tuple[list[int], torch.Tensor | None]:
        model, cfg = self.draft, s.sampler.cfg
        k = min(k, model.cfg.max_seq_len - len(s.tokens))
        if k < 1:
            return [], None
        state = self._states.get(s)
        if state is None:
            state = self._states[s] = _DraftState(KVCache(model.cfg, 1, device=model.device, dtype=model.dtype))
        state.cache.pos = min(state.cache.pos, len(s.tokens) - 1)  # at least the last token is fed again
        vocab = s.sampler.vocab_size
        feed = s.tokens[state.cache.pos:]
        drafts, dists = [], []
        for _ in range(k):
            ids = torch.tensor([feed], dtype=torch.long, device=model.device)
            logits = model(ids, head=Logits(last_only=True), cache=state.cache).logits[:, -1, :vocab].float()
            if cfg.greedy:
                token = int(logits.argmax(-1))
            else:
                q = filtered_probs(logits, cfg)
                token = int(torch.multinomial(q, 1, generator=s.sampler.generator))
                dists.append(q[0])
            drafts.append(token)
            feed = [token]
        return drafts, (torch.stack(dists) if dists else None)

    def rollback(self, s, start: int, accepted: int, proposed: int) -> None:
        """After verification: the draft's cache keeps what the target kept (the last draft was never fed)."""
        state = self._states.get(s)
        if state is not None:
            state.cache.pos = start + min(accepted, proposed - 1)


def accept(drafts: list[int], q: torch.Tensor | None, logits: torch.Tensor, sampler) -> tuple[list[int], int]:
    """The tokens a sequence keeps from one verification: (kept drafts + one token of the target's, how many
    drafts were kept). `logits` (len(drafts) + 1, V): the target's after each fed position."""
    cfg = sampler.cfg
    logits = logits[:, : sampler.vocab_size].float()
    if cfg.greedy:
        best = logits.argmax(-1).tolist()
        n = 0
        while n < len(drafts) and drafts[n] == best[n]:
            n += 1
        return drafts[:n] + [best[n]], n
    p = filtered_probs(logits, cfg)
    u = torch.rand(len(drafts), generator=sampler.generator, device=p.device)
    for j, t in enumerate(drafts):
        q_t = q[j, t] if q is not None else 1.0
        if u[j] * q_t < p[j, t]:  # kept with probability min(1, p / q)
            continue
        if q is not None:
            residual = (p[j] - q[j]).clamp_min(0)
        else:
            residual = p[j].clone()
            residual[t] = 0
        if not residual.sum() > 0:  # p <= q everywhere only when p == q: then nothing was rejected in law
            residual = p[j]
        token = int(torch.multinomial(residual / residual.sum(), 1, generator=sampler.generator))
        return drafts[:j] + [token], j
    return drafts + [int(torch.multinomial(p[-1], 1, generator=sampler.generator))], len(drafts)


def speculative_decode(core, spec: Speculator, seqs: list, events: list) -> None:
    """One decode step of the engine core with proposals: 1 to k + 1 tokens per sequence."""
    seqs = core._make_room(seqs, events)
    if not seqs:
        return
    max_len = core.cfg.max_seq_len
    proposals = [spec.propose(s, min(s.max_new - s.count - 1, max_len - len(s.tokens)))
                 if spec.eligible(s) else ([], None) for s in seqs]
    size = core.block_size
    for b, (s, (drafts, _)) in enumerate(zip(seqs, proposals)):  # slots for the drafts' K/V, if free
        need = math.ceil((len(s.tokens) + len(drafts)) / size) - len(s.blocks)
        if drafts and need > 0:
            got = core.pool.allocate(need)
            if got is None:
                proposals[b] = ([], None)
            else:
                s.blocks += got
    if not any(d for d, _ in proposals):
        core._decode_step(seqs, events)  # nothing to check: the plain step is faster
        return
    n_new = 1 + max(len(d) for d, _ in proposals)
    ids = torch.full((len(seqs), n_new), core.filler, dtype=torch.long)
    rows = []
    for b, (s, (drafts, _)) in enumerate(zip(seqs, proposals)):
        window = (s.tokens + drafts)[-n_new:]
        ids[b, n_new - len(window):] = torch.tensor(window, dtype=torch.long)
        rows.append((s.blocks, len(s.tokens) + len(drafts), len(s.tokens) - 1))
    view = layout(core.pages, rows, n_new, core.device)
    core._select([s.request.adapter for s in seqs])
    logits = core.model(ids.to(core.device), head=Logits(), cache=view).logits.float()
    core.decoder.invalidate()  # the pages changed under the plain step's gathered keys
    core.steps += 1
    if core.metrics is not None:
        core.metrics.decode_step(len(seqs))
    now, made = time.perf_counter(), 0
    for b, (s, (drafts, q)) in enumerate(zip(seqs, proposals)):
        start = len(s.tokens)
        if not drafts:
            s.cached = start
            core._register(s)
            core._sample([s], logits[b, -1:], events)
            continue
        kept, n = accept(drafts, q, logits[b, n_new - 1 - len(drafts):], s.sampler)
        spec.proposed += len(drafts)
        spec.accepted += n
        spec.rollback(s, start, n, len(drafts))
        s.cached = start + n  # the last token and the kept drafts now have their K/V
        s.tokens += drafts[:n]  # their blocks are keyed by their tokens (emitting may free the blocks)
        core._register(s)
        del s.tokens[start:]
        for token in kept:
            made += 1
            if core.emit(s, token, None, events, now):
                break
        if core.metrics is not None:
            core.metrics.speculated(len(drafts), n)
    if core.metrics is not None and made:
        core.metrics.generated_tokens(made)


# ---------------------------------------------------------------------- the command line (generate, serve)


def add_speculative_arguments(p) -> None:
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--speculative-method", choices=METHODS, default=None,
                   help="ngram: prompt lookup (no second model); draft: a small model over the same tokenizer")
    g.add_argument("--draft-model", default=None, metavar="DIR", help="the draft model (with --speculative-method draft)")
    g.add_argument("--num-speculative-tokens", type=int, default=4, help="tokens proposed per step (default: 4)")
    g.add_argument("--prompt-lookup-max", type=int, default=4, help="ngram: longest suffix looked up (default: 4)")
    g.add_argument("--prompt-lookup-min", type=int, default=1, help="ngram: shortest suffix looked up (default: 1)")


def speculator_from_args(args, tokenizer, device, dtype) -> Speculator | None:
    """The Speculator the flags ask for (its draft model loaded beside the target), or None."""
    method, draft_dir = getattr(args, "speculative_method", None), getattr(args, "draft_model", None)
    if method is None:
        if draft_dir:
            raise ConfigError("--draft-model needs --speculative-method draft", key="draft-model")
        return None
    cfg = SpeculativeConfig(method, args.num_speculative_tokens, args.prompt_lookup_max, args.prompt_lookup_min)
    cfg.validate()
    if method == "ngram":
        if draft_dir:
            raise ConfigError("--draft-model is for --speculative-method draft, not ngram", key="draft-model")
        return Speculator(cfg)
    if not draft_dir:
        raise ConfigError("--speculative-method draft needs --draft-model DIR", key="draft-model")
    draft, draft_tok = load_for_inference(draft_dir, device, dtype, None)
    probe = "The draft reads the target's tokens: 123, café."
    if draft_tok.vocab_size != tokenizer.vocab_size or draft_tok.encode(probe) != tokenizer.encode(probe):
        raise ConfigError(f"--draft-model {draft_dir}: its tokenizer ({draft_tok.vocab_size} tokens) is not the "
                          f"target's ({tokenizer.vocab_size}); a draft must be trained on the same tokenizer",
                          key="draft-model")
    return Speculator(cfg, draft=draft.eval())
