"""Model directories: safetensors weights and TOML config round trip exactly; bad files are refused."""

from __future__ import annotations

import pytest
import torch

from conftest import VARIANTS, tiny_config
from groundup.errors import CheckpointError
from groundup.model import Transformer
from groundup.model.model_dir import save_model
from groundup.quant.load import load_model


@pytest.mark.parametrize("variant", ["gqa", "mla_moe", "relu2_untied"])
def test_save_then_load_gives_identical_logits(tmp_path, variant):
    model = Transformer(tiny_config(**VARIANTS[variant])).eval()
    if model.moe_layers():
        model.moe_layers()[0].expert_bias.fill_(0.25)  # learned balancing state must survive
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m").eval()
    tokens = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, again(tokens).logits)
    assert again.cfg == model.cfg
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.safetensors", "model.toml"]


def test_load_in_bf16(tmp_path):
    save_model(Transformer(tiny_config()), tmp_path / "m")
    model = load_model(tmp_path / "m", dtype=torch.bfloat16)
    assert model.embed.weight.dtype == torch.bfloat16
    assert model.rope_cos.dtype == torch.float32  # tables stay exact; cast at use


def test_missing_corrupt_and_mismatched_files_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not a groundup model directory"):
        load_model(tmp_path)
    save_model(Transformer(tiny_config()), tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="unreadable safetensors file"):
        load_model(tmp_path / "m")
    save_model(Transformer(tiny_config(n_layers=3)), tmp_path / "m3")
    (tmp_path / "m3" / "model.toml").write_text((tmp_path / "m" / "model.toml").read_text())
    with pytest.raises(CheckpointError, match="do not match the model config"):
        load_model(tmp_path / "m3")
