"""The model's forward has a fixed signature and each head computes what its definition says from the logits."""

import inspect

import pytest
import torch
import torch.nn.functional as F

from groundup.model import ModelConfig, Transformer
from groundup.model.chunked_scores import TokenStats
from groundup.model.heads import (Logits, LogitsOutput, LossOutput, NextTokenLoss, RewardOutput, RewardScore,
                                  TokenLogprobs, TokenStatistics)
from groundup.model.kv_cache import KVCache
from groundup.model.loss import IGNORE_INDEX

CFG = dict(vocab_size=97, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, loss_chunk_size=5,
           final_logit_softcap=15.0, z_loss_coef=1e-3)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(**CFG, value_head=True)).eval()


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 97, (3, 12), generator=g)
    targets = torch.randint(0, 97, (3, 12), generator=g)
    targets[1, :4] = IGNORE_INDEX
    return tokens, targets


def test_forward_takes_a_fixed_set_of_parameters():
    params = list(inspect.signature(Transformer.forward).parameters)
    assert params == ["self", "tokens", "targets", "head", "cache", "pad_lens", "segments"]


def test_each_head_equals_its_definition_over_the_logits(model, batch):
    tokens, targets = batch
    with torch.no_grad():
        out = model(tokens)
        assert isinstance(out, LogitsOutput) and out.logits.shape == (3, 12, 97)
        logp = torch.log_softmax(out.logits, dim=-1)
        picked = logp.gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1)
        expected = torch.where(targets != IGNORE_INDEX, picked, 0.0)

        lp = model(tokens, targets, TokenLogprobs())
        assert isinstance(lp, torch.Tensor) and torch.allclose(lp, expected, atol=1e-5)
        hot = model(tokens, targets, TokenLogprobs(temperature=0.5))
        tempered = torch.log_softmax(out.logits / 0.5, dim=-1).gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1)
        assert torch.allclose(hot, torch.where(targets != IGNORE_INDEX, tempered, 0.0), atol=1e-4)

        stats = model(tokens, targets, TokenStatistics(top_k=3, vocab_limit=50))
        assert isinstance(stats, TokenStats) and torch.allclose(stats.logprobs, expected, atol=1e-5)
        assert torch.allclose(stats.entropy, -(logp.exp() * logp).sum(-1), atol=1e-5)
        assert torch.equal(stats.top_ids, logp[..., :50].topk(3, dim=-1).indices)

        loss = model(tokens, targets)
        assert isinstance(loss, LossOutput) and loss.logits is None
        ce = F.cross_entropy(out.logits.reshape(-1, 97), targets.reshape(-1), ignore_index=IGNORE_INDEX)
        z = torch.logsumexp(out.logits, -1)[targets != IGNORE_INDEX].square().mean()
        assert torch.allclose(loss.ce_loss, ce, atol=1e-5) and torch.allclose(loss.z_loss, z, atol=1e-4)
        assert torch.allclose(loss.loss, ce + 1e-3 * z, atol=1e-5)
        with_logits = model(tokens, targets, NextTokenLoss(return_logits=True))
        assert torch.allclose(with_logits.loss, loss.loss, atol=1e-5) and torch.equal(with_logits.logits, out.logits)

        index = torch.tensor([11, 5, 0])
        reward = model(tokens, targets, RewardScore(index))
        assert isinstance(reward, RewardOutput) and torch.allclose(reward.logprobs, expected, atol=1e-5)
        hidden = model(tokens, head=lambda m, x, t, aux: x)  # any callable is a head
        direct = model.value_head(hidden[torch.arange(3), index]).squeeze(-1)
        assert torch.allclose(reward.rewards, direct, atol=1e-6)
        assert model(tokens, head=RewardScore(index)).logprobs is None


def test_last_only_computes_the_last_position_alone_and_a_cache_continues_it(model, batch):
    tokens, _ = batch
    with torch.no_grad():
        full = model(tokens).logits
        last = model(tokens, head=Logits(last_only=True)).logits
        assert last.shape == (3, 1, 97) and torch.allclose(last[:, 0], full[:, -1], atol=1e-5)
        cache = KVCache(model.cfg, batch_size=3, max_len=32)
        model(tokens[:, :-1], head=Logits(last_only=True), cache=cache)
        step = model(tokens[:, -1:], cache=cache).logits
        assert torch.allclose(step[:, 0], full[:, -1], atol=1e-5)


def test_a_head_that_needs_targets_says_so(model, batch):
    tokens, _ = batch
    for head in (TokenLogprobs(), TokenStatistics(), NextTokenLoss()):
        with pytest.raises(ValueError, match=f"{type(head).__name__} needs targets"):
            model(tokens, head=head)
    plain = Transformer(ModelConfig(**CFG))
    with pytest.raises(ValueError, match="value head"):
        plain(tokens, head=RewardScore(torch.tensor([0, 0, 0])))
