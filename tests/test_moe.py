"""Mixture-of-experts routing, load statistics and auxiliary-loss-free balancing."""

from __future__ import annotations

import torch

from conftest import tiny_config
from groundup.model import Transformer
from groundup.model.moe import MoE, load_imbalance


def _skewed_moe(**overrides) -> MoE:
    moe = MoE(tiny_config(n_experts=8, moe_top_k=2, **overrides))
    torch.nn.init.normal_(moe.experts_in, std=0.02)
    torch.nn.init.normal_(moe.experts_out, std=0.02)
    with torch.no_grad():  # a router that prefers experts 0 and 1 for inputs with a large x[0]
        moe.router.weight.normal_(std=0.2)
        moe.router.weight[:2, 0] += 1.0
    return moe.train()


def _skewed_inputs(*shape) -> torch.Tensor:
    x = torch.randn(*shape, 64)
    x[..., 0] += 2.0
    return x


def test_every_token_reaches_exactly_top_k_experts_and_load_is_counted():
    moe = _skewed_moe()
    x = torch.randn(4, 16, 64)
    moe(x)
    assert moe.load.sum().item() == 4 * 16 * 2
    chosen, weights, _ = moe.route(x.reshape(-1, 64))
    assert chosen.shape == (64, 2) and torch.allclose(weights.sum(-1), torch.ones(64))


def test_bias_updates_move_a_skewed_router_toward_uniform_load():
    torch.manual_seed(0)
    moe = _skewed_moe()
    x = _skewed_inputs(8, 32)
    moe(x)
    before = load_imbalance(moe.update_bias(rate=0.0))
    for _ in range(50):
        moe(x)
        moe.update_bias(rate=0.01)
    moe(x)
    after = load_imbalance(moe.load)
    assert before > 2.0  # experts 0 and 1 get far more than their share of tokens
    assert after < 1.3
    # The bias changes which experts are chosen, never the gate weights' normalisation.
    _, weights, _ = moe.route(x.reshape(-1, 64))
    assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[0]))


def test_auxiliary_loss_is_minimal_for_uniform_routing_and_differentiable():
    moe = _skewed_moe(moe_aux_loss_coef=0.01)
    _, aux = moe(_skewed_inputs(2, 16))
    assert aux.item() > 0.012  # skewed: well above coef * 1.0, the uniform optimum
    aux.backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_model_exposes_moe_layers_and_keeps_the_first_layers_dense():
    model = Transformer(tiny_config(n_layers=3, n_experts=4, n_dense_layers=1))
    assert [isinstance(b.mlp, MoE) for b in model.blocks] == [False, True, True]
    assert len(model.moe_layers()) == 2
    assert "blocks.1.mlp.expert_bias" in model.state_dict()  # learned state travels with the weights
    assert "blocks.1.mlp.load" not in model.state_dict()  # statistics do not
