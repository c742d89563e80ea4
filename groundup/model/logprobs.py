"""One log-probability scorer: log p(target | context) per token, chunked, with the model's own head.

    lp = logprobs(model, tokens, targets, mask)            # (B, T) float32, 0 where mask is 0; differentiable
    st = token_stats(model, tokens, targets, top_k=5)      # no grad: log-probs, entropy, greedy flags,
                                                           # mean/std of log p under the model, top-k

Evaluation (log-likelihood of choices, perplexity, membership scores), DPO, KTO, GRPO and the
server's `logprobs` all call these, so they agree by construction. The scoring runs inside the
model's forward pass as a head (heads.py: TokenLogprobs, TokenStatistics), so DDP, FSDP2 and
torch.compile see an ordinary forward, and never holds the full (B x T x vocabulary) logits: the
output layer runs a chunk of positions at a time (chunked_scores.py). The model is used in whatever
mode it is in (train mode keeps dropout).
"""

from __future__ import annotations

import torch

from groundup.model.chunked_scores import TokenStats
from groundup.model.heads import TokenLogprobs, TokenStatistics
from groundup.model.loss import IGNORE_INDEX


def _targets_under_mask(targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return targets
    return targets.masked_fill(~mask.to(torch.bool), IGNORE_INDEX)


def logprobs(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None,
             *, pad_lens: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
    """(B, T) float32 log p(targets[b, t] | tokens[b, :t+1]); 0 where `mask` is 0 or the target is ignored.

    `model` may be wrapped (DDP, FSDP2, torch.compile): the scoring runs inside its forward pass, so
    gradients flow to the model as from any loss. `pad_lens`: left padding per row (see KVCache).
    `temperature`: the distribution softmax(logits / temperature), the policy a sampler at that
    temperature draws from (GRPO's log-probabilities, as TRL takes them).
    """
    return model(tokens, _targets_under_mask(targets, mask), TokenLogprobs(temperature), pad_lens=pad_lens)


def token_stats(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                mask: torch.Tensor | None = None, *, top_k: int = 0, pad_lens: torch.Tensor | None = None,
                vocab_limit: int | None = None) -> TokenStats:
    """`TokenStats` (each (B, T) or (B, T, k)) of `targets` under `model`, without gradients."""
    with torch.no_grad():
        return model(tokens, _targets_under_mask(targets, mask), TokenStatistics(top_k, vocab_limit), pad_lens=pad_lens)


def sequence_logprobs(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                      mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """(B,) the sum of each row's token log-probabilities under `mask` (a completion's log-likelihood)."""
    return logprobs(model, tokens, targets, mask, **kwargs).sum(dim=-1)
