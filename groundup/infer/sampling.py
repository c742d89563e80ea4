"""Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p, repetition penalty.

Everything runs on the logits' device (no per-step copies to the host) in Hugging Face's order:

    repetition penalty -> temperature -> top-k -> top-p -> min-p -> sample (or argmax)

- temperature 0 is greedy: argmax, and the filters below are moot.
- top-k keeps the k most likely tokens (0 = off); top-p keeps the smallest set of most likely
  tokens whose probability reaches p (1 = off); min-p drops tokens less likely than min_p times
  the most likely one (0 = off).
- The repetition penalty (CTRL, Keskar et al. 2019) divides positive logits and multiplies
  negative ones of every token already in the row (prompt included) by the penalty (1 = off).
- `seed` seeds a generator private to the call, so a run is reproducible and never disturbs (or
  depends on) torch's global random state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from groundup.config import ConfigError, did_you_mean, fail


# Temperatures below this are greedy (vLLM's _SAMPLING_EPS): logits divided by 5e-324 are infinite, and their
# softmax NaN.
GREEDY_BELOW = 1e-5


@dataclass
class SamplingConfig:
    max_new_tokens: int = 256
    temperature: float = 0.8  # 0 = greedy (so is anything below GREEDY_BELOW)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    seed: int = 0
    stop: list[str] = field(default_factory=list)  # stop strings, cut from the returned text
    overflow: Literal["error", "truncate"] = "error"  # a prompt too long for the context
    logprobs: bool = False  # also return each generated token's log-probability (the model's own, unprocessed)
    top_logprobs: int = 0  # with logprobs: the k most likely tokens at each step as well; 0 = none
    # The temperature reported log-probs and entropies are taken at: 1 = the model's own distribution
    # (vLLM's raw log-probs); GRPO passes its sampling temperature (the tempered policy, as TRL's).
    logprob_temperature: float = 1.0
    # Decoding constrained to a JSON schema, any JSON object, a regex, a choice or a grammar
    # (infer/structured.py's Structured); None = free text.
    structured: Any = None
    # False: special tokens other than the stop tokens are shown in the text, spelled out (vLLM's option; the
    # server turns it off for tool calls whose tags are special tokens, as Qwen's <tool_call> is).
    skip_special_tokens: bool = True

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            fail("max_new_tokens", self.max_new_tokens, "a positive integer")
        if not self.temperature >= 0:  # also refuses NaN
            fail("temperature", self.temperature, "a number >= 0 (0 = greedy)")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            fail("top_k", self.top_k, "an integer >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            fail("top_p", self.top_p, "a number in (0, 1] (1 = off)")
        if not 0 <= self.min_p < 1:
            fail("min_p", self.min_p, "a number in [0, 1) (0 = off)")
        if not self.repetition_penalty > 0:
            fail("repetition_penalty", self.repetition_penalty, "a number > 0 (1 = off)")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not isinstance(s, str) or not s for s in self.stop):
            fail("stop", self.stop, "a list of non-empty strings")
        if self.overflow not in ("error", "truncate"):
            fail("overflow", self.overflow, "'error' or 'truncate'")
        if not isinstance(self.top_logprobs, int) or not 0 <= self.top_logprobs <= 20:
            fail("top_logprobs", self.top_logprobs, "an integer in [0, 20]")
        if not self.logprob_temperature > 0:
            fail("logprob_temperature", self.logprob_temperature, "a number > 0 (1 = the model's own log-probs)")

    @classmethod
    def make(cls, base: "SamplingConfig | None" = None, **overrides) -> "SamplingConfig":
        """`base` (or the defaults) with keyword overrides, validated; an unknown keyword is named."""
        names = {f.name for f in dataclasses.fields(cls)}
        for key in overrides:
            if key not in names:
                hint = did_you_mean(key, names)
                raise ConfigError(f"unknown sampling option '{key}'{hint}; valid: {', '.join(sorted(names))}", key=key)
        cfg = dataclasses.replace(base or cls(), **overrides)
        cfg.validate()
        return cfg

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


class Sampler:
    """Picks one token per row from (B, V) logits; remembers each row's tokens for the penalty."""

    def __init__(self, cfg: SamplingConfig, prompts: list[list[int]], vocab_size: int, device: torch.device):
        self.cfg = cfg
        self.vocab_size = vocab_size  # the tokenizer's: a model padded past it never samples padding
        self.generator = None
        if not cfg.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(cfg.seed)
        self.seen = None
        if cfg.repetition_penalty != 1.0:
            self.seen = torch.zeros(len(prompts), vocab_size, dtype=torch.bool, device=device)
            for row, ids in enumerate(prompts):
                self.seen[row, torch.tensor(ids, dtype=torch.long, device=device)] = True

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """(B,) next-token ids from float32 logits (B, V_model)."""
        cfg = self.cfg
        logits = logits[:, : self.vocab_size]
        if self.seen is not None:
            p = cfg.repetition_penalty
            # finite whatever p is (5e-324 is 0 in float32): +inf becomes the largest float, a 0 logit stays 0
            penalised = torch.nan_to_num(torch.where(logits > 0, logits / p, logits * p), nan=0.0,
                                         neginf=float("-inf"))
            logits = torch.where(self.seen, penalised, logits)
        if cfg.greedy:
            tokens = logits.argmax(dim=-1)
        else:
            tokens = torch.multinomial(filtered_probs(logits, cfg), 1, generator=self.generator).squeeze(1)
        if self.seen is not None:
            self.seen.scatter_(1, tokens[:, None], True)
        return tokens

    def scores(self, logits: torch.Tensor, tokens: torch.Tensor) -> list[tuple[float, list | None, float]]:
        """Per row, (log p of the chosen token, [(id, log p)] of the k likeliest or None, the entropy) under
        the model's own distribution: before the penalty, temperature and filters, as vLLM's raw log-probs
        (or at `logprob_temperature`, still before the penalty and filters)."""
        logits = logits[:, : self.vocab_size].float()
        if self.cfg.logprob_temperature != 1.0:
            logits = logits / self.cfg.logprob_temperature
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(1, tokens[:, None]).squeeze(1).tolist()
        entropy = (-(logp.exp() * logp).sum(-1)).tolist()
        if not self.cfg.top_logprobs:
            return [(lp, None, h) for lp, h in zip(chosen, entropy)]
        values, ids = logp.topk(self.cfg.top_logprobs, dim=-1)
        return [(lp, list(zip(i, v)), h) for lp, i, v, h in zip(chosen, ids.tolist(), values.tolist(), entropy)]


def filtered_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p (the most likely token always survives)."""
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p.
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= cfg.top_p
        drop[:, 0] = False  # the most likely token survives any top_p (5e-324 is 0 in float32)
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    probs = logits.softmax(dim=-1)
    if cfg.min_p:
        probs = probs.masked_fill(probs < cfg.min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    return probs
