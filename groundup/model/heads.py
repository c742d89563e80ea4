"""What a forward pass computes from the last hidden state: one head per purpose, each with its result type.

    model(tokens)                                             Logits()        -> LogitsOutput(logits (B, T, V))
    model(tokens, head=Logits(last_only=True))                a prefill       -> LogitsOutput(logits (B, 1, V))
    model(tokens, targets)                                    NextTokenLoss() -> LossOutput(loss, ce_loss, ...)
    model(tokens, targets, head=TokenLogprobs(temperature=0.7))               -> (B, T) log p(target), differentiable
    model(tokens, targets, head=TokenStatistics(top_k=5))                    -> TokenStats (chunked_scores.py)
    model(tokens, head=RewardScore(index)); model(tokens, targets, head=RewardScore(index))  -> RewardOutput(rewards, logprobs)
    model(tokens, head=StepRewardScores(rows, positions))    a process reward model -> RewardOutput(rewards (N,))

The trunk (embedding, blocks, final norm) is the same for every head; the head then reads the final
hidden state `x` (B, T, D) inside `forward`, so DDP, FSDP2 and torch.compile see an ordinary forward
whatever is computed. The scoring heads never hold the (positions x vocabulary) logits: they go
through the chunked scorer of chunked_scores.py, as the fused loss does. A new objective adds a head here,
not a parameter to `Transformer.forward`.

A head is called as `head(model, x, targets, aux)`: `model` gives the output layer (`output_weight`,
`logits(x)`: a quantized model's own matmul) and the config; `aux` is the MoE balancing loss or None.
`last_only = True` (optional) tells the trunk that only the last position's output is read (a
prefill's last layer then runs its queries and MLP on one row). Any such callable is a head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from groundup.model.chunked_scores import TokenStats, chunked_logprobs, chunked_token_stats
from groundup.model.loss import IGNORE_INDEX, cross_entropy_with_z, fused_linear_cross_entropy


@dataclass
class LogitsOutput:
    logits: torch.Tensor  # (B, T, V) float32, soft-capped as the model caps them


@dataclass
class LossOutput:
    loss: torch.Tensor  # what to backpropagate: ce + z_loss_coef * z_loss + aux_loss
    ce_loss: torch.Tensor  # detached mean cross-entropy over the valid targets, for logging
    z_loss: torch.Tensor  # detached, unscaled mean log(Z)^2
    aux_loss: torch.Tensor | None = None  # MoE load-balancing loss (already scaled by its coefficient)
    logits: torch.Tensor | None = None  # (B, T, V) with NextTokenLoss(return_logits=True)


@dataclass
class RewardOutput:
    rewards: torch.Tensor  # (B,) float32: the value head at each row's index
    logprobs: torch.Tensor | None = None  # (B, T) of the targets, when targets were given


def _needs(targets: torch.Tensor | None, head: object) -> torch.Tensor:
    if targets is None:
        raise ValueError(f"{type(head).__name__} needs targets")
    return targets


@dataclass
class Logits:
    """The output layer's logits; `last_only`: of the last position only (generation needs no others)."""

    last_only: bool = False

    def __call__(self, model, x, targets, aux) -> LogitsOutput:
        return LogitsOutput(model.logits(x))


@dataclass
class NextTokenLoss:
    """Mean next-token cross-entropy plus z-loss and the MoE balancing loss, through the fused chunked loss
    (the logits are never materialised, unless `return_logits` or `model.cfg.loss_chunk_size = 0`)."""

    return_logits: bool = False
    last_only = False

    def __call__(self, model, x, targets, aux) -> LossOutput:
        targets = _needs(targets, self)
        cfg = model.cfg
        flat_x, flat_t = x.reshape(-1, x.shape[-1]), targets.reshape(-1)
        logits = None
        if cfg.loss_chunk_size and not self.return_logits:
            loss, ce, z = fused_linear_cross_entropy(flat_x, model.output_weight, flat_t, cfg.z_loss_coef,
                                                     cfg.final_logit_softcap, cfg.loss_chunk_size)
        else:
            logits = model.logits(x)
            loss, ce, z = cross_entropy_with_z(logits.reshape(-1, logits.shape[-1]), flat_t, cfg.z_loss_coef)
        if aux is not None:
            loss = loss + aux
        return LossOutput(loss, ce, z, None if aux is None else aux.detach(), logits)


def _chunk(model) -> int:
    return model.cfg.loss_chunk_size or 2048


@dataclass
class TokenLogprobs:
    """(B, T) log p(target) under softmax(logits / temperature), differentiable; 0 at ignored targets."""

    temperature: float = 1.0
    last_only = False

    def __call__(self, model, x, targets, aux) -> torch.Tensor:
        targets = _needs(targets, self)
        B, T, D = x.shape
        flat_x, flat_t = x.reshape(-1, D), targets.reshape(-1)
        cap = model.cfg.final_logit_softcap
        valid = flat_t != IGNORE_INDEX
        if torch.compiler.is_compiling() or bool(valid.all()):
            return chunked_logprobs(flat_x, model.output_weight, flat_t, cap, _chunk(model), self.temperature).view(B, T)
        # Only the scored positions reach the output layer (padding, prompts and a cached row's context
        # never do): the (positions x vocabulary) product is the largest matmul of a small model.
        idx = valid.nonzero().squeeze(1)
        lp = chunked_logprobs(flat_x.index_select(0, idx), model.output_weight, flat_t.index_select(0, idx), cap,
                              _chunk(model), self.temperature)
        return lp.new_zeros(B * T).index_copy(0, idx, lp).view(B, T)


@dataclass
class TokenStatistics:
    """`TokenStats` of the targets (no gradients): log-probs, entropy, greedy flags, the `top_k` most likely
    tokens below `vocab_limit` (a model padded past its tokenizer never proposes the padding)."""

    top_k: int = 0
    vocab_limit: int | None = None
    last_only = False

    def __call__(self, model, x, targets, aux) -> TokenStats:
        targets = _needs(targets, self)
        B, T, D = x.shape
        st = chunked_token_stats(x.reshape(-1, D), model.output_weight, targets.reshape(-1),
                                 model.cfg.final_logit_softcap, _chunk(model), self.top_k, self.vocab_limit)
        shaped = {k: v.view(B, T, *v.shape[1:]) if v is not None else None for k, v in vars(st).items()}
        return TokenStats(**shaped)


@dataclass
class RewardScore:
    """A reward model's value head at `index` (B,): each row's last real token. With targets, also their
    log-probabilities from the same trunk pass (a reward model trained with a language-modelling term)."""

    index: torch.Tensor
    last_only = False

    def __call__(self, model, x, targets, aux) -> RewardOutput:
        if model.value_head is None:
            raise ValueError("RewardScore needs a model with a value head (model.value_head = true)")
        rows = torch.arange(x.shape[0], device=x.device)
        rewards = model.value_head(x[rows, self.index.to(x.device)]).squeeze(-1).float()
        lp = None if targets is None else TokenLogprobs()(model, x, targets, aux)
        return RewardOutput(rewards, lp)


@dataclass
class StepRewardScores:
    """A process reward model's value head at several positions of each row: (`rows`[i], `positions`[i])
    is step i's last token, so `rewards` is (N,) over the steps of the batch, not (B,). With targets,
    also their log-probabilities from the same trunk pass (as RewardScore)."""

    rows: torch.Tensor
    positions: torch.Tensor
    last_only = False

    def __call__(self, model, x, targets, aux) -> RewardOutput:
        if model.value_head is None:
            raise ValueError("StepRewardScores needs a model with a value head (model.value_head = true)")
        picked = x[self.rows.to(x.device), self.positions.to(x.device)]
        rewards = model.value_head(picked).squeeze(-1).float()
        lp = None if targets is None else TokenLogprobs()(model, x, targets, aux)
        return RewardOutput(rewards, lp)
