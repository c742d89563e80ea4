"""The shared log-prob scorer against its definition: log_softmax of a full forward's logits."""

from __future__ import annotations

import pytest
import torch

from conftest import VARIANTS, tiny_config
from groundup.model import Transformer
from groundup.model.logprobs import logprobs, sequence_logprobs, token_stats
from groundup.model.loss import IGNORE_INDEX


def _model(variant: str, **extra) -> Transformer:
    # Larger weights than the init so that a wrong position, mask or cap could not hide in the noise.
    torch.manual_seed(0)
    model = Transformer(tiny_config(**{**VARIANTS[variant], "loss_chunk_size": 7, **extra}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    return model


def _batch(vocab: int = 256, B: int = 3, T: int = 11):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (B, T + 1), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    return tokens[:, :-1], tokens[:, 1:], mask


def _reference(model, tokens, targets, mask):
    logp = torch.log_softmax(model(tokens).logits.double(), dim=-1)
    return logp.gather(-1, targets[..., None]).squeeze(-1) * mask


@pytest.mark.parametrize("variant", ["gqa", "mla", "moe", "softcaps", "relu2_untied"])
def test_equal_to_log_softmax_of_a_full_forward(variant):
    model = _model(variant).eval()
    tokens, targets, mask = _batch()
    got = logprobs(model, tokens, targets, mask)
    assert got.dtype == torch.float32 and got.shape == targets.shape
    assert torch.allclose(got.double(), _reference(model, tokens, targets, mask), atol=1e-5)
    assert (got[~mask] == 0).all()
    total = sequence_logprobs(model, tokens, targets, mask)
    assert torch.allclose(total, got.sum(-1))


@pytest.mark.parametrize("variant", ["gqa", "softcaps"])
def test_gradients_equal_those_through_the_full_logits(variant):
    tokens, targets, mask = _batch()
    weights = torch.randn(targets.shape, generator=torch.Generator().manual_seed(2))
    grads = []
    for chunked in (True, False):
        model = _model(variant, tie_embeddings=variant == "gqa").train()
        if chunked:
            lp = logprobs(model, tokens, targets, mask)
        else:
            logp = torch.log_softmax(model(tokens).logits, dim=-1)
            lp = logp.gather(-1, targets[..., None]).squeeze(-1) * mask
        (lp * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("variant", ["gqa", "softcaps"])
def test_tempered_logprobs_and_their_gradients_equal_log_softmax_of_logits_over_t(variant):
    tokens, targets, mask = _batch()
    weights = torch.randn(targets.shape, generator=torch.Generator().manual_seed(2))
    values, grads = [], []
    for chunked in (True, False):
        model = _model(variant).train()
        if chunked:
            lp = logprobs(model, tokens, targets, mask, temperature=0.6)
        else:
            logp = torch.log_softmax(model(tokens).logits / 0.6, dim=-1)
            lp = logp.gather(-1, targets[..., None]).squeeze(-1) * mask
        (lp * weights).sum().backward()
        values.append(lp.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert torch.allclose(values[0], values[1], atol=1e-5)
    assert not torch.allclose(values[0], logprobs(_model(variant), tokens, targets, mask).detach(), atol=1e-2)
    for name in grads[1]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4), name


def test_ignored_targets_and_a_model_in_train_mode_stay_in_train_mode():
    model = _model("gqa", dropout=0.0).train()
    tokens, targets, mask = _batch()
    targets = targets.clone()
    targets[0, :4] = IGNORE_INDEX
    got = logprobs(model, tokens, targets)
    assert model.training
    assert (got[0, :4] == 0).all() and (got[0, 4:] != 0).all()


def test_token_stats_match_the_distribution():
    model = _model("gqa").eval()
    tokens, targets, mask = _batch()
    st = token_stats(model, tokens, targets, mask, top_k=3)
    logp = torch.log_softmax(model(tokens).logits.double(), dim=-1)
    p = logp.exp()
    assert torch.allclose(st.logprobs.double(), _reference(model, tokens, targets, mask), atol=1e-5)
    assert torch.allclose(st.entropy.double(), -(p * logp).sum(-1), atol=1e-5)
    assert torch.allclose(st.logp_mean.double(), (p * logp).sum(-1), atol=1e-5)
    var = (p * logp.square()).sum(-1) - (p * logp).sum(-1).square()
    assert torch.allclose(st.logp_std.double(), var.sqrt(), atol=1e-4)
    assert torch.equal(st.greedy, (logp.argmax(-1) == targets) & mask)
    values, ids = logp.topk(3, dim=-1)
    assert torch.equal(st.top_ids, ids) and torch.allclose(st.top_logprobs.double(), values, atol=1e-5)
    limited = token_stats(model, tokens, targets, top_k=2, vocab_limit=100)
    assert (limited.top_ids < 100).all()


def test_no_full_logits_are_held():
    """The scorer's peak extra memory is a chunk of logits, not B x T x V (measured on a large vocabulary)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(vocab_size=32768, loss_chunk_size=64, max_seq_len=512)).eval()
    tokens = torch.randint(0, 32768, (4, 512))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.no_grad():
            logprobs(model, tokens[:, :-1], tokens[:, 1:])
    biggest = max(e.cpu_memory_usage for e in prof.events())
    full_logits = 4 * 511 * 32768 * 4
    assert biggest < full_logits / 8, biggest
