"""`groundup import gguf`: a llama.cpp GGUF file becomes a groundup model that computes what transformers'
own GGUF loader computes, with a tokenizer that tokenizes as transformers' GGUF tokenizer does.

The files are written here with gguf.GGUFWriter from tiny random models, the way llama.cpp's converter
writes them: llama's Q and K rows permuted into llama.cpp's RoPE layout, norms in F32, matrices in
F16/BF16 or quantized with gguf.quants.quantize (Q8_0, Q4_0, Q4_1); K-quants, which the gguf package
cannot quantize, are crafted as valid blocks with small finite scales. The independent reference is
transformers' GGUF loader (`from_pretrained(dir, gguf_file=name)`), which dequantizes the same file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from groundup.config import ConfigError
from groundup.errors import CheckpointError, DataError
from groundup.interop.gguf_import import import_gguf
from groundup.interop.hf_weights import to_hf_state
from groundup.quant.load import load_model
from groundup.tokenizer import load_tokenizer
from groundup.tokenizer.hf_format import derive_merges, to_unicode
from infer_helpers import small_tokenizer, tiny_model
from test_tokenizer_hf import CHATML_TEMPLATE, TEXTS, spm_vocab

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[bench]')")
Q = gguf.GGMLQuantizationType

GGUF_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
              "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
K_QUANTS = {Q.Q4_K: (144, [0, 2]), Q.Q5_K: (176, [0, 2]), Q.Q6_K: (210, [208])}  # block bytes, f16 scale offsets


def gguf_name(hf: str) -> str:
    stem, suffix = hf.rsplit(".", 1)
    if stem in GGUF_NAMES:
        return f"{GGUF_NAMES[stem]}.{suffix}"
    _, _, layer, part = stem.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[part]}.{suffix}"


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: rows of each head into interleaved RoPE pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def crafted_k_quant(shape: tuple[int, int], qtype, rng: np.random.Generator) -> np.ndarray:
    size, scale_at = K_QUANTS[qtype]
    blocks = rng.integers(0, 256, (shape[0], shape[1] // 256, size), dtype=np.uint8)
    for k, at in enumerate(scale_at):  # d (and dmin): small and finite, so values stay near +-0.1
        blocks[..., at:at + 2] = np.full(blocks.shape[:2], (2e-4, 1e-4)[k] if qtype != Q.Q6_K else 2e-5,
                                         dtype=np.float16)[..., None].view(np.uint8)
    return blocks.reshape(shape[0], -1)


def byte_level_meta(pre: str) -> dict:
    tok = small_tokenizer()
    _, merges = derive_merges(tok.tokens)
    tokens = [to_unicode(t) for t in tok.tokens] + list(tok.special_names.values())
    return {"model": "gpt2", "pre": pre, "tokens": tokens, "types": [1] * len(tok.tokens) + [3] * len(tok.specials),
            "merges": [f"{to_unicode(a)} {to_unicode(b)}" for a, b in merges], "bos": tok.bos_id, "eos": tok.eot_id,
            "pad": tok.pad_id, "add_bos": False}


def spm_meta() -> dict:
    tokens, scores, types = spm_vocab()
    return {"model": "llama", "tokens": tokens, "scores": scores, "types": types, "bos": 1, "eos": 2, "unk": 0}


def write_gguf(path: Path, model, arch: str, tokenizer: dict, qtypes: dict | None = None, extra: dict | None = None,
               seed: int = 0) -> Path:
    """`model` as llama.cpp's converter writes `arch` (norms F32, matrices F16 unless `qtypes` says)."""
    cfg, rng = model.cfg, np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-test")
    writer.add_context_length(cfg.max_seq_len)
    writer.add_embedding_length(cfg.d_model)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.ffn_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_vocab_size(cfg.vocab_size)
    if arch == "llama":
        writer.add_rope_dimension_count(cfg.attn_head_dim)
    if arch == "qwen3":
        writer.add_key_length(cfg.attn_head_dim)
        writer.add_value_length(cfg.attn_head_dim)
    writer.add_tokenizer_model(tokenizer["model"])
    if "pre" in tokenizer:
        writer.add_tokenizer_pre(tokenizer["pre"])
    writer.add_token_list(tokenizer["tokens"])
    writer.add_token_types(tokenizer["types"])
    if "merges" in tokenizer:
        writer.add_token_merges(tokenizer["merges"])
    if "scores" in tokenizer:
        writer.add_token_scores(tokenizer["scores"])
    writer.add_bos_token_id(tokenizer["bos"])
    writer.add_eos_token_id(tokenizer["eos"])
    for key, add in (("pad", writer.add_pad_token_id), ("unk", writer.add_unk_token_id),
                     ("add_bos", writer.add_add_bos_token), ("template", writer.add_chat_template)):
        if key in tokenizer:
            add(tokenizer[key])
    for key, value in (extra or {}).items():
        writer.add_key_value(key, *value)
    hf_arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[arch]
    for hf, tensor in to_hf_state(hf_arch, cfg, model.state_dict()).items():
        name, w = gguf_name(hf), tensor.float().numpy()
        if arch == "llama" and name.split(".")[-2] in ("attn_q", "attn_k"):
            w = llama_cpp_permute(w, cfg.n_heads if "attn_q" in name else cfg.kv_heads)
        qtype = (qtypes or {}).get(name, Q.F32 if w.ndim == 1 else Q.F16)
        if qtype in K_QUANTS:
            writer.add_tensor(name, crafted_k_quant(w.shape, qtype, rng), raw_dtype=qtype)
        elif qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, w.astype(np.float32 if qtype == Q.F32 else np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def randomised(**overrides):
    """A tiny model whose every tensor is random and large enough that a wrong mapping shows in the logits."""
    model = tiny_model(**overrides)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.08 * torch.randn_like(p))
    return model


# variant -> (architecture, model overrides, tensor types beyond the F32/F16 default, tokenizer pre)
VARIANTS = {
    "llama_gqa_quantized": ("llama", {"n_kv_heads": 2, "d_ff": 256}, {
        "token_embd.weight": Q.Q8_0, "blk.0.attn_q.weight": Q.Q4_0, "blk.0.attn_k.weight": Q.Q4_1,
        "blk.0.attn_v.weight": Q.BF16, "blk.1.attn_q.weight": Q.Q8_0, "blk.0.ffn_down.weight": Q.Q4_K,
        "blk.1.ffn_down.weight": Q.Q5_K, "output.weight": Q.Q8_0}, "llama-bpe"),
    "qwen2_tied_qkv_bias": ("qwen2", {"qkv_bias": True, "tie_embeddings": True, "d_ff": 256, "rope_theta": 1e6},
                            {"blk.0.ffn_down.weight": Q.Q6_K, "blk.1.attn_output.weight": Q.Q8_0}, "qwen2"),
    # transformers' GGUF loader reads no head size for qwen3 and takes Qwen3Config's 128, as Qwen3 models have
    "qwen3_qk_norm": ("qwen3", {"qk_norm": True, "n_kv_heads": 2, "head_dim": 128},
                      {"blk.1.attn_output.weight": Q.Q4_K, "blk.0.attn_q.weight": Q.BF16}, "qwen2"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_equal_transformers_gguf_loader(tmp_path, variant):
    arch, overrides, qtypes, pre = VARIANTS[variant]
    model = randomised(tie_embeddings=overrides.pop("tie_embeddings", False), **overrides)
    meta = {**byte_level_meta(pre), **({"template": CHATML_TEMPLATE} if arch == "qwen2" else {})}
    write_gguf(tmp_path / "m.gguf", model, arch, meta, qtypes)
    name, no_tokenizer = import_gguf(tmp_path / "m.gguf", tmp_path / "ours")
    assert name == arch and no_tokenizer is None
    ours = load_model(tmp_path / "ours")
    assert ours.cfg.qkv_bias == (arch == "qwen2") and ours.cfg.qk_norm == (arch == "qwen3")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf",
                                                               dtype=torch.float32).eval()
    tokens = torch.randint(0, ours.cfg.vocab_size, (2, 20))
    with torch.no_grad():
        a, b = ours(tokens).logits, theirs(tokens).logits
    assert a.abs().max() > 0.5 and (a - b).abs().max() <= 1e-4, (a - b).abs().max()
    tok = load_tokenizer(tmp_path / "ours" / "tokenizer")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    assert tok.prefix_ids == hf_tok("x")["input_ids"][:-1] and tok.eot_id == hf_tok.eos_token_id
    if arch == "qwen2":
        chat = [{"role": "user", "content": "Who goes there?"}, {"role": "assistant", "content": "A friend."}]
        assert tok.render_chat(chat)[0] == list(hf_tok.apply_chat_template(chat, tokenize=True, return_dict=False))
        assert tok.end_of_turn_id == tok.eot_id == small_tokenizer().eot_id  # the template's <|end_of_text|>


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_tokenization_equals_transformers_gguf_tokenizer(tmp_path, kind):
    meta = byte_level_meta("llama-bpe") if kind == "byte_level" else spm_meta()
    model = tiny_model(vocab_size=len(meta["tokens"]))
    write_gguf(tmp_path / "t.gguf", model, "llama", meta)
    _, no_tokenizer = import_gguf(tmp_path / "t.gguf", tmp_path / "ours")
    assert no_tokenizer is None
    tok = load_tokenizer(tmp_path / "ours" / "tokenizer")
    split = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf", split_special_tokens=True)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    for text in TEXTS + ["<s>KING</s> <|begin_of_text|>hi<|end_of_text|>"]:
        ids = tok.encode(text)
        assert ids == split(text, add_special_tokens=False)["input_ids"], text
        assert theirs(text)["input_ids"] == tok.prefix_ids + theirs(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == theirs.decode(ids)
    assert tok.prefix_ids == ([1] if kind == "sentencepiece" else [])  # llama.cpp adds bos to SentencePiece
    if kind == "sentencepiece":
        assert tok.special_token_ids == {0, 1, 2} and tok.id_to_bytes(3 + ord("K")) == b"K"
        assert tok.decode_bytes(tok.encode("the")) == b" the"


def test_unsupported_architecture_and_tensor_type_are_refused_with_nothing_written(tmp_path):
    model = tiny_model()
    write_gguf(tmp_path / "a.gguf", model, "llama", byte_level_meta("llama-bpe"))
    data = (tmp_path / "a.gguf").read_bytes()
    (tmp_path / "b.gguf").write_bytes(data.replace(b"llama.", b"gemma."))  # key prefixes follow the architecture
    text = b"general.architecture"
    at = data.index(text) + len(text) + 4 + 8  # value type (u32), string length (u64), then the name
    (tmp_path / "b.gguf").write_bytes(data[:at] + b"gemma" + data[at + 5:].replace(b"llama.", b"gemma."))
    with pytest.raises(ConfigError, match="general.architecture = 'gemma' is not importable; supported: llama"):
        import_gguf(tmp_path / "b.gguf", tmp_path / "out")
    write_gguf(tmp_path / "c.gguf", model, "llama", byte_level_meta("llama-bpe"), {"blk.0.attn_v.weight": Q.Q5_0})
    with pytest.raises(CheckpointError, match="tensor blk.0.attn_v.weight is Q5_0; groundup dequantizes F32"):
        import_gguf(tmp_path / "c.gguf", tmp_path / "out")
    write_gguf(tmp_path / "d.gguf", model, "llama", byte_level_meta("llama-bpe"),
               extra={"llama.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING)})
    with pytest.raises(ConfigError, match="llama.rope.scaling.type = 'yarn'"):
        import_gguf(tmp_path / "d.gguf", tmp_path / "out")
    (tmp_path / "e.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="e.gguf: not a readable GGUF file"):
        import_gguf(tmp_path / "e.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "a.gguf", "b.gguf", "c.gguf", "d.gguf", "e.gguf"]  # no temporary directory left behind either


def test_an_unreadable_tokenizer_does_not_stop_the_import(tmp_path):
    write_gguf(tmp_path / "m.gguf", tiny_model(), "llama", byte_level_meta("deepseek-llm"))
    _, no_tokenizer = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert "tokenizer.ggml.pre = 'deepseek-llm' is not a pre-tokenizer groundup knows" in no_tokenizer
    assert (tmp_path / "out" / "model.safetensors").is_file() and not (tmp_path / "out" / "tokenizer").exists()


def test_command_refuses_a_non_empty_out_unless_overwrite(tmp_path, capsys):
    from groundup.cli import main
    from groundup.infer import Generator

    write_gguf(tmp_path / "m.gguf", randomised(), "llama", byte_level_meta("llama-bpe"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    args = ["import", "gguf", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    assert main(args + ["--overwrite", "--dtype", "float32"]) == 0
    assert "from a GGUF llama model" in capsys.readouterr().out and not (tmp_path / "out" / "keep.txt").exists()
    assert main(["import", "gguf", str(tmp_path / "m.gguf"), "--out", str(tmp_path), "--overwrite"]) == 2
    assert "which this command reads" in capsys.readouterr().err
    model = load_model(tmp_path / "out")
    assert model.embed.weight.dtype == torch.float32
    tok = load_tokenizer(tmp_path / "out" / "tokenizer")
    got = Generator(model, tok).generate_ids([tok.prefix_ids + tok.encode("KING")], max_new_tokens=4, temperature=0)
    assert len(got[0]) == 4
    cfg = json.loads((tmp_path / "out" / "tokenizer" / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|end_of_text|>" and cfg["add_bos_token"] is False


def test_default_dtype_follows_the_stored_matrices_and_the_import_is_the_model(tmp_path):
    model = randomised(n_kv_heads=2, qkv_bias=True)
    write_gguf(tmp_path / "m.gguf", model, "llama", byte_level_meta("llama-bpe"))  # every matrix F16
    import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    again = load_model(tmp_path / "out")
    assert again.embed.weight.dtype == torch.float16 and again.cfg.qkv_bias
    for name, tensor in model.state_dict().items():  # the permuted Q and K rows (and biases) are restored
        assert torch.equal(again.state_dict()[name], tensor.half()), name
    with pytest.raises(DataError, match="exists and is not empty"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")


@pytest.mark.parametrize("pre", ["smollm", "gpt2", "qwen2", "llama3", "tekken", "gpt-4o"])
def test_every_known_pre_tokenizer_round_trips(tmp_path, pre):
    write_gguf(tmp_path / "m.gguf", tiny_model(), "llama", byte_level_meta(pre))
    _, no_tokenizer = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    tok = load_tokenizer(tmp_path / "out" / "tokenizer")
    assert no_tokenizer is None and all(tok.decode(tok.encode(t)) == t for t in TEXTS)
    digits = tok.encode("2024")
    assert len(digits) == (4 if pre in ("smollm", "qwen2", "tekken") else len(digits))  # single-digit splitters
