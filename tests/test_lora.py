"""LoRA: the base model at step 0, only adapters train, merging is exact, and peft reads our adapters
(and we read peft's) with the same logits."""

from __future__ import annotations

import pytest
import torch

from conftest import MLA, VARIANTS
from groundup.interop import export_hf
from groundup.interop.peft_format import load_adapter, save_adapter
from groundup.model.lora import LoraConfig, adapter_state, apply_lora, merge_lora
from groundup.train.config import OptimConfig
from groundup.train.optimizers import build_optimizers
from infer_helpers import VOCAB, model_dir, small_tokenizer, tiny_model

TOKENS = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


def _randomise_adapters(model, seed=1, std=0.2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def _logits(model):
    with torch.no_grad():
        return model(TOKENS).logits


@pytest.mark.parametrize("variant, targets", [("gqa", ["all"]), ("mla", ["attention", "mlp"]), ("moe", ["all"]),
                                             ("relu2_untied", ["mlp", "o_proj"])])
def test_step_zero_is_the_base_model_and_only_adapters_train(variant, targets):
    model = tiny_model(**VARIANTS[variant])
    before = _logits(model)
    adapted = apply_lora(model, LoraConfig(rank=4, alpha=8, targets=targets))
    assert adapted and torch.equal(_logits(model), before)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    optimizers = build_optimizers(model, OptimConfig())
    held = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad}
    if variant == "moe":
        assert any("experts_in" in n for n in adapted) and any("experts_in.lora_A" in k for k in adapter_state(model))


@pytest.mark.parametrize("variant", ["gqa", "mla", "moe", "sandwich_geglu"])
def test_merged_equals_unmerged(variant):
    model = tiny_model(**VARIANTS[variant])
    base = _logits(model)
    apply_lora(model, LoraConfig(rank=4, alpha=8, targets=["all"], rslora=True))
    _randomise_adapters(model, std=0.1)
    unmerged = _logits(model)
    assert (unmerged - base).abs().max() > 1e-2  # the adapters matter
    merge_lora(model)
    assert not any("lora_" in n for n, _ in model.named_parameters())
    assert torch.allclose(_logits(model), unmerged, atol=1e-5)


@pytest.mark.parametrize("variant", ["gqa", "qk_norm", "mla"])
def test_peft_reads_our_adapter_with_the_same_logits(tmp_path, variant):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    overrides = {**VARIANTS[variant], **({"norm_eps": 1e-6} if variant == "mla" else {})}
    model = tiny_model(**overrides)
    model_dir(tmp_path / "base", model, small_tokenizer())
    export_hf(tmp_path / "base", tmp_path / "hf")
    # peft maps MLP targets of DeepSeek models to transformers 5's fused expert parameters, which a
    # dense DeepSeek layer does not have, so for MLA the comparison covers the attention adapters.
    lora = LoraConfig(rank=4, alpha=8, targets=["attention"] if variant == "mla" else ["attention", "mlp"])
    apply_lora(model, lora)
    _randomise_adapters(model)
    save_adapter(model, lora, tmp_path / "adapter", base=str(tmp_path / "hf"))
    theirs = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "hf"), tmp_path / "adapter").eval()
    with torch.no_grad():
        expected = theirs(TOKENS).logits
    assert torch.allclose(_logits(model), expected, atol=1e-4)
    fresh = tiny_model(**overrides)
    load_adapter(fresh, tmp_path / "adapter")  # and back: our loader reads the peft names
    assert torch.allclose(_logits(fresh), _logits(model), atol=1e-6)


def test_we_read_an_adapter_peft_made(tmp_path):
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = tiny_model()
    model_dir(tmp_path / "base", model, small_tokenizer())
    export_hf(tmp_path / "base", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    peft_model = get_peft_model(hf, PeftLoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    peft_model.save_pretrained(tmp_path / "peft")
    with torch.no_grad():
        expected = peft_model.eval()(TOKENS).logits
    lora = load_adapter(model, tmp_path / "peft")
    assert lora.rank == 4 and lora.targets == ["qkv_proj"]
    assert torch.allclose(_logits(model), expected, atol=1e-4)


def test_experts_are_saved_under_our_own_names(tmp_path):
    model = tiny_model(**VARIANTS["moe"])
    lora = LoraConfig(rank=2, targets=["all"])
    apply_lora(model, lora)
    _randomise_adapters(model)
    save_adapter(model, lora, tmp_path / "a")
    fresh = tiny_model(**VARIANTS["moe"])
    load_adapter(fresh, tmp_path / "a")
    assert torch.allclose(_logits(fresh), _logits(model), atol=1e-6)
    assert MLA  # the MLA variant is covered above through VARIANTS
