"""`groundup export gguf`: the file reads back through `groundup import gguf` as the same model up to the
type's rounding, and through transformers' GGUF loader (an independent reader of llama.cpp's layout) with
the same logits and the same tokenization as groundup's.

Round trip bounds: f32 bit-exact; f16 exactly each weight rounded to f16; q8_0 and q4_0 exactly what
`gguf.quants` quantize-dequantize gives for the (llama: Q/K-permuted) weight, which is within half a
step (q8_0: amax/127 per block of 32) or one step (q4_0: amax/8) of it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from groundup.cli import main
from groundup.config import ConfigError
from groundup.errors import DataError
from groundup.interop.gguf_export import export_gguf, permute_rope_rows
from groundup.interop.gguf_import import import_gguf, read_gguf
from groundup.quant.load import load_model
from groundup.quant import quantize_model, save_quantized_model
from groundup.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer
from infer_helpers import model_dir, small_tokenizer
from test_gguf import randomised
from test_tokenizer_hf import CHAT, TEXTS, corpus_text

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[bench]')")
Q = gguf.GGMLQuantizationType
# relative logit error ||ours - exported|| / ||ours|| each type may cost on these random weights
LOGIT_TOLERANCE = {"f32": 1e-6, "f16": 2e-3, "q8_0": 2e-2, "q4_0": 0.4}  # 4 bits: about 0.3 here
ARCHES = {"llama": {"n_kv_heads": 2, "d_ff": 256},
          "qwen2": {"qkv_bias": True, "tie_embeddings": True, "d_ff": 256, "rope_theta": 1e6},
          # transformers' GGUF loader reads no head size for qwen3 and takes Qwen3Config's 128
          "qwen3": {"qk_norm": True, "n_kv_heads": 2, "head_dim": 128, "d_ff": 256}}
_cache: dict = {}


def gpt4_tokenizer():
    """A byte-level BPE on groundup's "gpt4" pattern, whose regex llama.cpp knows as llama-bpe exactly."""
    if "gpt4" not in _cache:
        _cache["gpt4"] = train_tokenizer(corpus_text(), TokenizerConfig(vocab_size=512, pattern="gpt4"), progress=False)
    return _cache["gpt4"]


def exported(tmp_path: Path, arch: str = "llama", type_: str = "f32", tokenizer=None, **overrides):
    cfg = {**ARCHES[arch], **overrides}
    model = randomised(tie_embeddings=cfg.pop("tie_embeddings", False), **cfg)
    source = model_dir(tmp_path / f"src-{arch}", model, tokenizer)
    report = export_gguf(source, tmp_path / "g" / f"{arch}-{type_}.gguf", type_)
    return model, report


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits.float()


def rel(a, b) -> float:
    return float((a - b).norm() / a.norm())


@pytest.mark.parametrize("type_", ["f32", "f16", "q8_0", "q4_0"])
def test_round_trip_through_import_gguf_is_the_model_up_to_the_types_rounding(tmp_path, type_):
    model, report = exported(tmp_path, "llama", type_)
    assert (report.arch, report.type, report.tensors) == ("llama", type_, 3 + 9 * model.cfg.n_layers)
    import_gguf(report.path, tmp_path / "back", dtype="float32")
    back = load_model(tmp_path / "back")
    ours, theirs = model.state_dict(), back.state_dict()
    assert back.cfg.n_kv_heads == 2 and back.cfg.d_ff == 256 and not back.cfg.tie_embeddings
    for name, w in ours.items():
        got = theirs[name]
        if w.dim() == 1 or type_ == "f32":
            assert torch.equal(got, w), name
        elif type_ == "f16":
            assert torch.equal(got, w.half().float()), name
        else:  # exactly gguf's quantize-dequantize of the weight as written (Q/K rows permuted for llama)
            qtype = Q.Q8_0 if type_ == "q8_0" else Q.Q4_0
            expected = _gguf_rounded(w.numpy(), name, model.cfg, qtype)
            assert np.array_equal(got.numpy(), expected), name
            blocks = w.reshape(-1, 32)
            step = blocks.abs().amax(dim=1, keepdim=True) / (127 if type_ == "q8_0" else 8)
            assert ((got.reshape(-1, 32) - blocks).abs() <= step * 1.01 + 1e-7).all(), name
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 24))
    assert rel(logits(model, tokens), logits(back, tokens)) <= LOGIT_TOLERANCE[type_]


def _gguf_rounded(w: np.ndarray, name: str, cfg, qtype) -> np.ndarray:
    """What q8_0/q4_0 export then import gives for our tensor `name` (fused parts permuted as written)."""
    def rt(x, heads=None):
        if heads:
            x = permute_rope_rows(x, heads)
        y = np.asarray(gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(x), qtype), qtype))
        if heads:  # undo, as the importer does
            y = y.reshape(heads, y.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(y.shape)
        return y

    if name.endswith("qkv_proj.weight"):
        d = cfg.attn_head_dim
        q, k, v = np.split(w, [cfg.n_heads * d, (cfg.n_heads + cfg.kv_heads) * d])
        return np.concatenate([rt(q, cfg.n_heads), rt(k, cfg.kv_heads), rt(v)])
    if name.endswith("gate_up_proj.weight"):
        return np.concatenate([rt(p) for p in np.split(w, 2)])
    return rt(w)


@pytest.mark.parametrize("arch", list(ARCHES))
@pytest.mark.parametrize("type_", ["f32", "q8_0"])
def test_transformers_gguf_loader_computes_our_logits(tmp_path, arch, type_):
    model, report = exported(tmp_path, arch, type_)
    assert report.arch == arch
    import_gguf(report.path, tmp_path / "back", dtype="float32")
    back = load_model(tmp_path / "back")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(report.path.parent), gguf_file=report.path.name,
                                                           dtype=torch.float32).eval()
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 20))
    theirs, ours, original = logits(hf, tokens), logits(back, tokens), logits(model, tokens)
    assert original.abs().max() > 0.5 and (theirs - ours).abs().max() <= 1e-4  # the same file, read alike
    assert rel(original, theirs) <= LOGIT_TOLERANCE[type_]
    meta = read_gguf(report.path)[1]
    assert ("output.weight" in {t.name for t in read_gguf(report.path)[0].tensors}) == (arch != "qwen2")  # tied
    assert meta[f"{arch}.attention.head_count_kv"] == model.cfg.kv_heads and meta["general.file_type"] == \
        {"f32": 0, "q8_0": 7}[type_]


@pytest.mark.parametrize("pattern", ["gpt4", "gpt4-fast"])
def test_transformers_gguf_tokenizer_tokenizes_as_groundup(tmp_path, pattern):
    tok = gpt4_tokenizer() if pattern == "gpt4" else small_tokenizer()
    _, report = exported(tmp_path, "llama", "f16", tokenizer=tok)
    assert report.pre == "llama-bpe" and bool(report.notes) == (pattern == "gpt4-fast")
    hf = transformers.AutoTokenizer.from_pretrained(str(report.path.parent), gguf_file=report.path.name)
    split = transformers.AutoTokenizer.from_pretrained(str(report.path.parent), gguf_file=report.path.name,
                                                       split_special_tokens=True)
    import_gguf(report.path, tmp_path / "back")
    back = load_tokenizer(tmp_path / "back" / "tokenizer")
    for text in TEXTS + ["<|user|>hi<|end_of_turn|>", corpus_text(3000)[0]]:
        ids = tok.encode(text)
        if pattern == "gpt4-fast" and ("  " in text or "\t" in text):  # the documented difference
            theirs = split(text, add_special_tokens=False)["input_ids"]
            assert theirs != ids and hf.decode(theirs) == text and back.encode(text) == theirs
            continue
        assert split(text, add_special_tokens=False)["input_ids"] == ids, text
        # llama.cpp's BOS is groundup's prefix: <|end_of_text|> before every plain text
        assert hf(text)["input_ids"] == tok.prefix_ids + hf(text, add_special_tokens=False)["input_ids"]
        assert back.encode(text) == ids and back.prefix_ids == tok.prefix_ids == [tok.eot_id]
        assert hf.decode(ids) == tok.decode(ids)
    assert list(hf.apply_chat_template(CHAT, tokenize=True, return_dict=False)) == tok.render_chat(CHAT)[0]
    meta = read_gguf(report.path)[1]
    assert meta["tokenizer.ggml.bos_token_id"] == meta["tokenizer.ggml.eos_token_id"] == tok.eot_id
    assert meta["tokenizer.ggml.add_bos_token"] is True and meta["tokenizer.ggml.eot_token_id"] == tok.end_of_turn_id
    assert meta["tokenizer.ggml.padding_token_id"] == tok.pad_id
    types = meta["tokenizer.ggml.token_type"]
    assert [types[i] for i in sorted(tok.special_token_ids)] == [3] * len(tok.special_token_ids)
    assert set(types[:len(tok.tokens)]) == {1}


def test_vocabulary_padding_and_a_hugging_face_tokenizer_round_trip(tmp_path):
    """A model with more embeddings than tokens gets [PADn] UNUSED tokens; the model imported back carries a
    Hugging Face tokenizer, which exports to the same tokenizer metadata and (f32) the same tensors."""
    _, report = exported(tmp_path, "qwen2", "f32", vocab_size=520)
    meta = read_gguf(report.path)[1]
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == 520 and tokens[-1] == "[PAD519]" and types[512:] == [5] * 8
    import_gguf(report.path, tmp_path / "back")
    assert load_tokenizer(tmp_path / "back" / "tokenizer").backend == "huggingface"
    again = export_gguf(tmp_path / "back", tmp_path / "again.gguf", "f32")
    reader2, meta2 = read_gguf(again.path)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.pre",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
                "qwen2.rope.freq_base", "qwen2.context_length"):
        assert meta2.get(key) == meta.get(key), key
    first = {t.name: np.array(t.data) for t in read_gguf(report.path)[0].tensors}
    assert {t.name: np.array(t.data).tobytes() for t in reader2.tensors} == {k: v.tobytes() for k, v in first.items()}


def test_a_quantized_model_exports_exactly_as_f32_and_is_refused_where_it_cannot(tmp_path):
    model = randomised(n_kv_heads=2, d_ff=256)
    quantize_model(model, "int8")
    save_quantized_model(model, tmp_path / "q8")
    small_tokenizer().save(tmp_path / "q8" / "tokenizer")
    for type_ in ("f16", "q8_0", "q4_0"):
        with pytest.raises(ConfigError, match=r"blocks\.0\.attn\.qkv_proj \(int8 .*--type f32"):
            export_gguf(tmp_path / "q8", tmp_path / f"q-{type_}.gguf", type_)
        assert not any(tmp_path.glob("*.gguf")) and not any(tmp_path.glob(".*tmp*"))  # nothing written
    report = export_gguf(tmp_path / "q8", tmp_path / "q.gguf")  # default for a quantized model: f32
    assert report.type == "f32"
    import_gguf(report.path, tmp_path / "back", dtype="float32")
    tokens = torch.randint(0, 512, (2, 16))
    from groundup.quant import set_kernel_backend
    previous = set_kernel_backend("dequant")
    try:
        assert (logits(model, tokens) - logits(load_model(tmp_path / "back"), tokens)).abs().max() <= 1e-4
    finally:
        set_kernel_backend(previous)


@pytest.mark.parametrize("overrides, key", [
    ({"n_experts": 4, "moe_top_k": 2}, "n_experts"), ({"attention": "mla", "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                                                      "qk_rope_head_dim": 16, "v_head_dim": 16, "norm_eps": 1e-6}, "attention"),
    ({"norm_placement": "sandwich", "embed_scale": True}, "norm_placement"), ({"final_logit_softcap": 30.0}, "final_logit_softcap"),
    ({"mlp": "gelu"}, "mlp"), ({"mlp": "geglu"}, "mlp"), ({"bias": True}, "bias"), ({"norm": "layernorm"}, "norm"),
    ({"qk_norm": True, "qkv_bias": True}, "qkv_bias"), ({"embed_scale": True}, "embed_scale")])
def test_what_llama_cpp_cannot_compute_is_refused_by_name_before_writing(tmp_path, overrides, key):
    model = randomised(**overrides)
    source = model_dir(tmp_path / "m", model)
    with pytest.raises(ConfigError, match=rf"cannot export {key} = .* to GGUF"):
        export_gguf(source, tmp_path / "out.gguf", "f16")
    assert os.listdir(tmp_path) == ["m"]


def test_the_cli_writes_atomically_and_refuses_to_overwrite(tmp_path, capsys):
    source = model_dir(tmp_path / "m", randomised(d_ff=256), gpt4_tokenizer())
    out = tmp_path / "out" / "m.gguf"
    assert main(["export", "gguf", "--checkpoint", str(source), "--type", "q4_0", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "wrote" in printed.out and "llama, q4_0" in printed.out and "llama-bpe" in printed.out
    assert not printed.err  # gpt4: the exact pre-tokenizer, no note
    assert os.listdir(out.parent) == ["m.gguf"]
    assert main(["export", "gguf", "--checkpoint", str(source), "--type", "q4_0", "--out", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["export", "gguf", "--checkpoint", str(source), "--type", "q5_k", "--out", str(out),
                 "--overwrite"]) == 2
    assert "expected one of f32, f16, q8_0, q4_0" in capsys.readouterr().err
    with pytest.raises(DataError, match="is a directory"):
        export_gguf(source, tmp_path, "f16")
    with pytest.raises(DataError, match="a file of the model being exported"):
        export_gguf(source, source / "model.safetensors", "f16", overwrite=True)


@pytest.mark.parametrize("pattern, digits, pre, note", [("gpt4", 3, "llama-bpe", None), ("gpt4", 1, "qwen2", "NFC"),
                                                        ("gpt4-fast", 3, "llama-bpe", "spaces or tabs"),
                                                        ("gpt4", 2, "llama-bpe", "groups of up to 2 digits")])
def test_the_pre_tokenizer_name_is_the_split_regex_or_the_nearest_with_the_difference_said(pattern, digits, pre, note):
    import json

    from groundup.interop.gguf_export import pre_tokenizer
    from groundup.interop.gguf_tokenizer import PRE_TOKENIZERS
    from groundup.tokenizer.hf_format import split_pattern

    tok = train_tokenizer(corpus_text(20_000), TokenizerConfig(vocab_size=300, pattern=pattern, digit_group=digits),
                          progress=False)
    name, why = pre_tokenizer(tok, json.loads(tok.to_json()))
    assert name == pre and (why is None if note is None else note in why)
    if pattern == "gpt4" and digits == 3:
        assert PRE_TOKENIZERS[name][0] == split_pattern("gpt4", 3) == tok.pattern and PRE_TOKENIZERS[name][1]


def test_a_sentencepiece_tokenizer_is_refused_by_name(tmp_path):
    from test_gguf import spm_meta, write_gguf

    from infer_helpers import tiny_model

    meta = spm_meta()
    write_gguf(tmp_path / "spm.gguf", tiny_model(vocab_size=len(meta["tokens"])), "llama", meta)
    import_gguf(tmp_path / "spm.gguf", tmp_path / "spm")
    with pytest.raises(DataError, match="byte-level BPE tokenizers"):
        export_gguf(tmp_path / "spm", tmp_path / "out.gguf", "f16")
    assert not (tmp_path / "out.gguf").exists()
