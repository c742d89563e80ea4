"""Optimizers: parameter groups, Muon's split, Lion's update, Newton-Schulz, and each one learning."""

from __future__ import annotations

import io

import pytest
import torch

from groundup.config import from_dict
from groundup.model import Transformer
from groundup.train.config import OptimConfig
from groundup.train.optimizers import Lion, NewtonSchulzMuon, build_optimizers, param_groups, zeropower_newton_schulz
from tests.conftest import tiny_config


def optim(**kw) -> OptimConfig:
    return from_dict(OptimConfig, kw)


def names(groups, key):
    return {n for n, _ in groups[key]}


def test_no_decay_on_norms_biases_and_embeddings_by_default():
    model = Transformer(tiny_config(bias=True, tie_embeddings=False))
    groups = param_groups(model, optim())
    decay, no_decay = names(groups, "decay"), names(groups, "no_decay")
    assert "embed.weight" in no_decay and "lm_head.weight" in decay
    assert all(n.endswith("bias") or "norm" in n or n == "embed.weight" for n in no_decay)
    assert all(p.dim() == 2 for _, p in groups["decay"])
    assert decay | no_decay == {n for n, _ in model.named_parameters()}
    assert "embed.weight" in names(param_groups(model, optim(decay_embeddings=True)), "decay")
    adamw = build_optimizers(model, optim(weight_decay=0.1))[0]
    assert [g["weight_decay"] for g in adamw.param_groups] == [0.1, 0.0]
    assert adamw.defaults["fused"] is True


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = Transformer(tiny_config(tie_embeddings=False))
    groups = param_groups(model, optim(name="muon"))
    assert names(groups, "muon") == {n for n, p in model.named_parameters()
                                     if p.dim() == 2 and n not in ("embed.weight", "lm_head.weight")}
    muon, adamw = build_optimizers(model, optim(name="muon"))
    expected = torch.optim.Muon if hasattr(torch.optim, "Muon") else NewtonSchulzMuon  # torch >= 2.9 has it
    assert isinstance(muon, expected) and isinstance(adamw, torch.optim.AdamW)
    moe = Transformer(tiny_config(n_experts=4, moe_top_k=2))  # 3-D expert stacks stay with AdamW
    assert not any(p.dim() == 3 for _, p in param_groups(moe, optim(name="muon"))["muon"])


def test_newton_schulz_orthogonalises():
    torch.manual_seed(0)
    g = torch.randn(48, 32)
    x = zeropower_newton_schulz(g, steps=5)
    s = torch.linalg.svdvals(x)
    assert 0.5 < s.min() and s.max() < 1.3  # the quintic iteration lands singular values near 1
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    assert torch.nn.functional.cosine_similarity((u @ vh).flatten(), x.flatten(), dim=0) > 0.95


def test_lion_steps_by_the_sign_with_decoupled_decay():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    p.grad = torch.tensor([0.3, -0.01, 0.0])
    opt.step()
    expected = torch.tensor([1.0, -2.0, 3.0]) * (1 - 0.1 * 0.5) - 0.1 * torch.tensor([1.0, -1.0, 0.0])
    torch.testing.assert_close(p.detach(), expected)
    torch.testing.assert_close(opt.state[p]["exp_avg"], torch.tensor([0.3, -0.01, 0.0]) * 0.01)


@pytest.mark.parametrize("name", ["adamw", "muon", "lion"])
def test_each_optimizer_learns_and_its_state_loads_weights_only(name):
    torch.manual_seed(0)
    model = Transformer(tiny_config())
    optimizers = build_optimizers(model, optim(name=name))
    tokens = torch.randint(0, 256, (4, 33))
    lr = 1e-3 if name == "lion" else 3e-3
    losses = []
    for _ in range(25):
        for opt in optimizers:
            for g in opt.param_groups:
                g["lr"] = lr
        loss = model(tokens[:, :-1], tokens[:, 1:]).loss
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.75
    buf = io.BytesIO()
    torch.save([opt.state_dict() for opt in optimizers], buf)
    buf.seek(0)
    torch.load(buf, weights_only=True)


def test_newton_schulz_muon_fallback_learns():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(16, 16) * 0.1)
    target = torch.randn(16, 16)
    opt = NewtonSchulzMuon([w], lr=0.3, weight_decay=0.0)
    first = None
    for _ in range(30):
        loss = ((w - target) ** 2).mean()
        first = first or float(loss.detach())
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert float(loss.detach()) < first * 0.5


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon arrived in torch 2.9")
def test_fallback_muon_takes_torch_muons_step():
    torch.manual_seed(0)
    start, grad = torch.randn(24, 40), torch.randn(24, 40)
    steps = []
    for cls, kw in ((NewtonSchulzMuon, {}), (torch.optim.Muon, {"adjust_lr_fn": "match_rms_adamw"})):
        w = torch.nn.Parameter(start.clone())
        opt = cls([w], lr=0.01, weight_decay=0.1, **kw)
        w.grad = grad.clone()
        opt.step()
        steps.append(w.detach() - start)
    torch.testing.assert_close(steps[0], steps[1], rtol=0.05, atol=2e-4)  # fp32 vs torch's bf16 iteration
