"""QLoRA: LoRA adapters in full precision over a quantized, frozen base (`groundup sft --base Q lora.rank=...`).

The base stays integer (int8 or int4) and frozen; step 0 is the quantized base exactly; the loss falls;
a resume is bit-exact; the backward pass keeps no float copy of any quantized weight; merging
dequantizes (the merged model is an ordinary float one); full fine-tuning of a quantized base is refused;
and the adapter is peft's: over the dequantized base exported to Hugging Face, peft gives our logits."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from groundup.config import ConfigError, load_config
from groundup.loading import load_for_inference
from groundup.model.model_dir import save_model
from groundup.quant.load import load_model
from groundup.model.lora import LoraConfig, LoRALinear, apply_lora
from groundup.posttrain.config import SFTConfig
from groundup.posttrain.sft import sft
from groundup.quant import (QuantizedTransformer, QuantLinear, QuantWeight, dequantize_model, quantize_model,
                            save_quantized_model, set_kernel_backend)
from infer_helpers import small_tokenizer, tiny_model
from train_helpers import metrics, run_cli

FORMATS = {"int8": {}, "int4": {"group_size": 32}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Quantized bases (int8, int4 g32) of one tiny model, and chat data, on the small tokenizer."""
    root = tmp_path_factory.mktemp("qlora")
    for method, options in FORMATS.items():
        model = tiny_model(max_seq_len=128)
        quantize_model(model, method, **options)
        save_quantized_model(model, root / method)
        small_tokenizer().save(root / method / "tokenizer")
    run_cli("data", "sample", "--chat", "--out", str(root / "chat"), "--domains", "math", "--math-count", "400")
    return root


def _cfg(root, base, *extra):
    data = json.dumps([str(root / "chat" / "chat-math.jsonl"), str(root / "chat" / "chat-math.heldout.jsonl")])
    return load_config(SFTConfig, None, [f"base={json.dumps(str(base))}", f"sft.data={data}", "train.seq_len=128",
                                         "train.batch_size=4", "train.threads=2", "log.every=1", "log.progress=false",
                                         "eval.every=0", "eval.at_end=false", "checkpoint.every=3", *extra])


LORA = ["lora.rank=4", "lora.alpha=8", "schedule.peak_lr=1e-2", "train.max_steps=6"]


def _logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_step_zero_is_the_quantized_base_and_the_fused_parts_split_right(setup, fmt):
    model = load_model(setup / fmt)
    tokens = torch.randint(0, 512, (2, 24))
    before = _logits(model, tokens)
    adapted = apply_lora(model, LoraConfig(rank=4, alpha=8, targets=["all"]))
    assert isinstance(model, QuantizedTransformer) and torch.equal(_logits(model, tokens), before)  # B = 0
    wrapped = {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    assert set(wrapped) == set(adapted) and all(isinstance(m.base, QuantLinear) for m in wrapped.values())
    cfg, d = model.cfg, model.cfg.attn_head_dim
    qkv = wrapped["blocks.0.attn.qkv_proj"]
    assert qkv.parts == [cfg.n_heads * d, cfg.kv_heads * d, cfg.kv_heads * d]
    assert wrapped["blocks.0.mlp.gate_up_proj"].parts == [cfg.ffn_dim, cfg.ffn_dim]
    assert [n for n, p in model.named_parameters() if p.requires_grad] == \
        [n for n, _ in model.named_parameters() if ".lora_" in n]  # the integers are buffers; norms frozen too
    with torch.no_grad():  # each part's B moves its own rows only
        qkv.lora_B[cfg.n_heads * d:].normal_()
    q_rows = slice(0, cfg.n_heads * d)
    x = torch.randn(3, cfg.d_model)
    assert torch.equal(qkv(x)[:, q_rows], qkv.base(x)[:, q_rows])


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_backward_pass_keeps_no_float_copy_of_a_quantized_weight_and_is_exact(setup, fmt):
    model = load_model(setup / fmt).train()
    apply_lora(model, LoraConfig(rank=4, alpha=8))
    shapes = {tuple(m.qweight.shape[:-1]) + (m.in_features,) for m in model.modules() if isinstance(m, QuantWeight)}
    saved = []
    tokens = torch.randint(0, 512, (2, 24))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        loss = model(tokens, tokens).loss
    assert saved and not shapes & set(saved)
    loss.backward()
    # The same gradients as dequantize-then-matmul (the float reference over the same weights).
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    reference = load_model(setup / fmt).train()
    apply_lora(reference, LoraConfig(rank=4, alpha=8))
    reference.load_state_dict(model.state_dict())
    previous = set_kernel_backend("dequant")
    try:
        for m in reference.modules():
            if isinstance(m, LoRALinear):
                m.base = _float(m.base)
        reference(tokens, tokens).loss.backward()
    finally:
        set_kernel_backend(previous)
    for n, p in reference.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[n], p.grad, rtol=1e-4, atol=1e-6), n


def _float(q: QuantLinear) -> torch.nn.Linear:
    linear = torch.nn.Linear(q.in_features, q.out_features, bias=q.bias is not None)
    linear.weight = torch.nn.Parameter(q.dequantize(), requires_grad=False)
    return linear


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_qlora_lowers_the_loss_and_resumes_exactly(setup, tmp_path, fmt):
    base_bytes = (setup / fmt / "model.safetensors").read_bytes()
    summary = sft(_cfg(setup, setup / fmt, *LORA), tmp_path / "run")
    steps, _ = metrics(tmp_path / "run")
    assert summary["steps"] == 6 and steps[-1]["loss"] < steps[0]["loss"]
    final = tmp_path / "run" / "checkpoints" / "step_0000006"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    meta = json.loads((final / "groundup_adapter.json").read_text())
    assert meta["base"] == str((setup / fmt).resolve())
    assert (setup / fmt / "model.safetensors").read_bytes() == base_bytes  # the base never changes
    shutil.copytree(tmp_path / "run", tmp_path / "resumed")
    (tmp_path / "resumed" / "checkpoints" / "step_0000006" / "meta.json").unlink()
    sft(_cfg(setup, setup / fmt, *LORA), tmp_path / "resumed", resume=True)
    a = load_file(final / "adapter_model.safetensors")
    b = load_file(tmp_path / "resumed" / "checkpoints" / "step_0000006" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [s["loss"] for s in metrics(tmp_path / "resumed")[0]] == [s["loss"] for s in steps]

    # Loading the run: the quantized base with the adapter; merging dequantizes (float model, same logits).
    model, _ = load_for_inference(tmp_path / "run")
    assert isinstance(model, QuantizedTransformer)
    merged, _ = load_for_inference(tmp_path / "run", merge=True)
    assert type(merged).__name__ == "Transformer" and not any(isinstance(m, QuantWeight) for m in merged.modules())
    tokens = torch.randint(0, 512, (2, 24))
    assert (_logits(model, tokens) - _logits(merged, tokens)).abs().max() <= 1e-4


def test_full_fine_tuning_of_a_quantized_base_is_refused(setup, tmp_path):
    with pytest.raises(ConfigError, match=r"is quantized \(int8 .*use LoRA \(lora.rank\) on a quantized base"):
        sft(_cfg(setup, setup / "int8", "train.max_steps=2"), tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_merge_verb_and_peft_over_the_dequantized_base(setup, tmp_path):
    """`groundup merge` of a QLoRA run writes a full-precision model; the adapter itself is peft's, relative to
    the dequantized base: exported to Hugging Face, peft over it gives our QLoRA logits."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from groundup.interop.export import export_hf

    run_cli("sft", "--base", str(setup / "int4"), "--data", str(setup / "chat" / "chat-math.jsonl"), "--out",
            str(tmp_path / "run"), "--quiet", "lora.rank=4", "train.max_steps=2", "train.seq_len=96",
            "train.batch_size=2", "eval.at_end=false", "schedule.peak_lr=3e-2")
    run_cli("merge", "--adapter", str(tmp_path / "run"), "--out", str(tmp_path / "merged"))
    merged = load_model(tmp_path / "merged")
    assert not (tmp_path / "merged" / "model.toml").read_text().count("[quantization]")
    qlora, _ = load_for_inference(tmp_path / "run")
    tokens = torch.randint(0, 512, (2, 24))
    ours = _logits(qlora, tokens)
    assert (ours - _logits(merged, tokens)).abs().max() <= 1e-4

    base = dequantize_model(load_model(setup / "int4"))
    save_model(base, tmp_path / "deq")
    small_tokenizer().save(tmp_path / "deq" / "tokenizer")
    export_hf(tmp_path / "deq", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    adapter = tmp_path / "run" / "checkpoints" / "step_0000002"
    with torch.no_grad():
        theirs = peft.PeftModel.from_pretrained(hf, str(adapter)).eval()(tokens).logits
    assert (ours - theirs).abs().max() <= 1e-4
