"""The transformer's contracts: causality, KV-cache equivalence, GQA = MHA, losses, bf16."""

from __future__ import annotations

import pytest
import torch

from conftest import VARIANTS, tiny_config
from groundup.model import KVCache, Transformer
from groundup.model.heads import Logits, NextTokenLoss


def _model(**overrides) -> Transformer:
    return Transformer(tiny_config(**overrides)).eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_changing_a_later_token_never_changes_earlier_logits(variant):
    model = _model(**VARIANTS[variant])
    tokens = torch.randint(0, 256, (2, 24))
    changed = tokens.clone()
    changed[:, 12] = (changed[:, 12] + 7) % 256
    with torch.no_grad():
        a, b = model(tokens).logits, model(changed).logits
    assert torch.equal(a[:, :12], b[:, :12])
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-3  # and the change is seen from t on


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_then_decode_equals_full_forward(variant):
    cfg = tiny_config(**VARIANTS[variant])
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 256, (3, 30))
    with torch.no_grad():
        full = model(tokens).logits
        cache = KVCache(cfg, batch_size=3, max_len=40)
        steps = [model(tokens[:, :9], cache=cache).logits]
        steps += [model(tokens[:, t : t + 1], cache=cache).logits for t in range(9, 30)]
    assert cache.pos == 30
    assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-5


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_last_only_prefill_gives_the_last_logits_and_the_same_cache(variant):
    """last_only runs the last layer's queries and MLP on one position: the logits, and the keys and
    values every later step reads, must be those of the full forward (left-padded rows too)."""
    cfg = tiny_config(**VARIANTS[variant])
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 256, (2, 11))
    pad = torch.tensor([3, 0])
    nxt = torch.randint(0, 256, (2, 1))
    with torch.no_grad():
        full = model(tokens).logits
        assert (model(tokens, head=Logits(last_only=True)).logits[:, 0] - full[:, -1]).abs().max() <= 1e-5
        caches = [KVCache(cfg, batch_size=2, max_len=16, pad_lens=pad) for _ in range(2)]
        whole = model(tokens, cache=caches[0]).logits
        last = model(tokens, head=Logits(last_only=True), cache=caches[1]).logits
        assert last.shape[1] == 1 and (last[:, 0] - whole[:, -1]).abs().max() <= 1e-5
        steps = [model(nxt, cache=c).logits for c in caches]
    assert (steps[0] - steps[1]).abs().max() <= 1e-5


@pytest.mark.parametrize("variant", ["gqa", "mla", "moe"])
def test_left_padded_rows_decode_as_if_alone(variant):
    cfg = tiny_config(**VARIANTS[variant])
    model = Transformer(cfg).eval()
    short, long_ = torch.randint(0, 256, (1, 5)), torch.randint(0, 256, (1, 9))
    batch = torch.cat([torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1), long_])
    pad = torch.tensor([4, 0])
    nxt = torch.randint(0, 256, (2, 1))
    with torch.no_grad():
        cache = KVCache(cfg, batch_size=2, max_len=16, pad_lens=pad)
        prefill = model(batch, cache=cache).logits
        step = model(nxt, cache=cache).logits
        alone = model(torch.cat([short, nxt[:1]], 1)).logits
        full_padded = model(torch.cat([batch, nxt], 1), pad_lens=pad).logits
    assert (prefill[0, 4:] - alone[0, :5]).abs().max() <= 1e-5
    assert (step[0, 0] - alone[0, 5]).abs().max() <= 1e-5
    assert (step[:, 0] - full_padded[:, -1]).abs().max() <= 1e-5


def test_gqa_with_all_kv_heads_equals_mha_given_the_same_weights():
    mha = _model(n_kv_heads=None)
    gqa = _model(n_kv_heads=4)
    gqa.load_state_dict(mha.state_dict())
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert torch.equal(mha(tokens).logits, gqa(tokens).logits)


def test_gqa_matches_an_explicit_repeated_head_mha():
    """GQA with 2 KV heads is MHA whose K/V projections repeat each KV head for its query group."""
    gqa = _model(n_kv_heads=2)
    mha = _model(n_kv_heads=4)
    state = gqa.state_dict()
    d, hd = 64, 16
    for i in range(2):
        w = state[f"blocks.{i}.attn.qkv_proj.weight"]
        q, k, v = w.split([4 * hd, 2 * hd, 2 * hd])
        k = k.view(2, hd, d).repeat_interleave(2, dim=0).reshape(4 * hd, d)
        v = v.view(2, hd, d).repeat_interleave(2, dim=0).reshape(4 * hd, d)
        state[f"blocks.{i}.attn.qkv_proj.weight"] = torch.cat([q, k, v])
    mha.load_state_dict(state)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert (gqa(tokens).logits - mha(tokens).logits).abs().max() <= 1e-5


def test_loss_is_mean_cross_entropy_over_non_ignored_positions():
    model = _model()
    tokens = torch.randint(0, 256, (2, 16))
    targets = torch.randint(0, 256, (2, 16))
    targets[0, :5] = -100
    out = model(tokens, targets)
    logits = model(tokens).logits
    keep = targets != -100
    expected = torch.nn.functional.cross_entropy(logits[keep], targets[keep])
    assert out.logits is None  # the fused loss never materialises them
    assert abs(out.loss.item() - expected.item()) <= 1e-5
    assert abs(out.ce_loss.item() - expected.item()) <= 1e-5


def test_z_loss_is_reported_separately_and_added_with_its_coefficient():
    model = _model(z_loss_coef=1e-2)
    tokens = torch.randint(0, 256, (2, 16))
    out = model(tokens, tokens)
    logits = model(tokens).logits.reshape(-1, 256)
    z = torch.logsumexp(logits, -1).square().mean()
    assert abs(out.z_loss.item() - z.item()) <= 1e-4
    assert abs(out.loss.item() - (out.ce_loss.item() + 1e-2 * z.item())) <= 1e-5


@pytest.mark.parametrize("variant", ["gqa", "softcaps", "moe"])
def test_fused_and_plain_loss_give_the_same_gradients(variant):
    model = Transformer(tiny_config(z_loss_coef=1e-3, **VARIANTS[variant]))
    tokens = torch.randint(0, 256, (2, 16))
    targets = tokens.roll(-1, dims=1)
    targets[:, -1] = -100
    model(tokens, targets).loss.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(tokens, targets, NextTokenLoss(return_logits=True)).loss.backward()
    for name, p in model.named_parameters():
        assert (fused[name] - p.grad).abs().max() <= 1e-5, name


def test_bf16_autocast_gives_finite_outputs_of_the_right_shapes():
    model = _model(**VARIANTS["moe"])
    tokens = torch.randint(0, 256, (2, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens, tokens)
        logits = model(tokens).logits
    assert logits.shape == (2, 12, 256) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all() and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_pure_bf16_weights_train_step_is_finite():
    model = Transformer(tiny_config()).to(torch.bfloat16)
    tokens = torch.randint(0, 256, (2, 12))
    out = model(tokens, tokens)
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    assert model.embed.weight.grad.dtype == torch.bfloat16


def test_activation_checkpointing_gives_the_same_gradients():
    model = Transformer(tiny_config())
    tokens = torch.randint(0, 256, (2, 16))
    model(tokens, tokens).loss.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.grad_checkpointing = True
    model(tokens, tokens).loss.backward()
    for a, p in zip(ref, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-6)


def test_sequence_longer_than_context_is_refused():
    model = _model(max_seq_len=32)
    with pytest.raises(ValueError, match="exceeds max_seq_len 32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_residual_projections_use_the_scaled_init():
    model = Transformer(tiny_config(d_model=256, n_heads=4, n_layers=8))
    o_std = model.blocks[0].attn.o_proj.weight.std().item()
    q_std = model.blocks[0].attn.qkv_proj.weight.std().item()
    assert abs(q_std - 0.02) < 0.002
    assert abs(o_std - 0.02 / 4) < 0.001  # 1 / sqrt(2 * 8 layers)
