"""Hugging Face export and import: transformers loads the export with no custom code and computes
the same logits and greedy tokens; what no standard architecture expresses is refused by name; the
round trip export -> import is exact."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import MLA
from groundup.config import ConfigError
from groundup.errors import CheckpointError
from groundup.infer import Generator
from groundup.interop import export_hf, import_hf
from groundup.quant.load import load_model
from infer_helpers import VOCAB, model_dir, small_tokenizer, tiny_model

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install -e '.[bench]'); interop tests need it")

MLA6 = {**MLA, "norm_eps": 1e-6}  # transformers' DeepSeek normalises the MLA latents with eps 1e-6

# variant -> (config overrides, the architecture it must export as)
EXPORTABLE = {
    "llama_tied": ({}, "llama"),
    "llama_untied_bias_linear_rope": ({"tie_embeddings": False, "bias": True, "rope_scaling": "linear",
                                       "rope_scaling_factor": 2.0}, "llama"),
    "llama_mqa_geglu_ntk": ({"n_kv_heads": 1, "mlp": "geglu", "rope_scaling": "ntk", "rope_scaling_factor": 4.0},
                            "llama"),
    "qwen2_qkv_bias": ({"qkv_bias": True, "n_kv_heads": 2}, "qwen2"),
    "qwen3_qk_norm": ({"qk_norm": True, "n_kv_heads": 4}, "qwen3"),
    "gemma2": ({"norm_placement": "sandwich", "embed_scale": True, "mlp": "geglu", "attn_logit_softcap": 5.0,
                "final_logit_softcap": 10.0}, "gemma2"),
    "gemma3_qk_norm": ({"norm_placement": "sandwich", "embed_scale": True, "qk_norm": True, "tie_embeddings": False},
                       "gemma3_text"),
    "mixtral": ({"n_experts": 4, "moe_top_k": 2}, "mixtral"),
    "qwen3_moe": ({"n_experts": 4, "moe_top_k": 2, "qk_norm": True, "n_dense_layers": 1, "moe_norm_topk": False},
                  "qwen3_moe"),
    "deepseek_v2_dense_mla": ({**MLA6, "q_lora_rank": 24}, "deepseek_v2"),
    "deepseek_v2_moe": ({**MLA6, "n_experts": 4, "moe_top_k": 2, "n_shared_experts": 1, "moe_norm_topk": False},
                        "deepseek_v2"),
    "deepseek_v3": ({**MLA6, "n_experts": 4, "moe_top_k": 2, "moe_router": "sigmoid", "n_shared_experts": 1,
                     "n_dense_layers": 1, "tie_embeddings": False}, "deepseek_v3"),
}


def _randomised(seed: int = 0, **overrides):
    """A tiny model whose every tensor is random and large enough for mistakes to show in the logits
    (fresh norms are all ones and a fresh selection bias is zero, which would hide wrong mappings)."""
    model = tiny_model(seed, **overrides)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.08 * torch.randn_like(p))
        for moe in model.moe_layers():
            if model.cfg.moe_router == "sigmoid":
                moe.expert_bias.copy_(0.1 * torch.randn_like(moe.expert_bias))
    return model


def _load_hf(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("variant", list(EXPORTABLE))
def test_transformers_computes_the_same_logits_and_greedy_tokens(tmp_path, variant):
    overrides, arch = EXPORTABLE[variant]
    model = _randomised(**overrides)
    model_dir(tmp_path / "ours", model)
    assert export_hf(tmp_path / "ours", tmp_path / "hf") == arch
    hf = _load_hf(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == arch
    tokens = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        ours, theirs = model(tokens).logits, hf(tokens).logits
    assert ours.abs().max() > 0.5  # big enough that a wrong mapping could not hide under 1e-4
    assert (ours - theirs).abs().max() <= 1e-4
    prompt = tokens[:1, :8]
    with torch.no_grad():
        hf_out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    expected = hf_out[0, 8:].tolist()
    got = Generator(model, small_tokenizer()).generate_ids([prompt[0].tolist()], max_new_tokens=12, temperature=0)[0]
    assert got == expected


def test_batched_left_padded_greedy_generation_matches_transformers(tmp_path):
    tok = small_tokenizer()
    model = _randomised(tie_embeddings=False)
    model_dir(tmp_path / "ours", model)
    export_hf(tmp_path / "ours", tmp_path / "hf")
    hf, hf_tok = _load_hf(tmp_path / "hf"), transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf_tok.padding_side = "left"
    prompts = ["To be, or not to be", "My lord"]
    batch = hf_tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**batch, max_new_tokens=10, do_sample=False)
    expected = [row[batch["input_ids"].shape[1]:].tolist() for row in out]
    # The exported tokenizer puts <|end_of_text|> before a prompt, as groundup does (tok.prefix_ids).
    got = Generator(model, tok).generate_ids([tok.prefix_ids + tok.encode(p) for p in prompts], max_new_tokens=10,
                                             temperature=0)
    stops = {tok.eot_id, tok.end_of_turn_id}
    for g, e in zip(got, expected):  # transformers pads a row after it stops
        assert g == e[: len(g)] and (len(g) == 10 or g[-1] in stops)


def test_auto_tokenizer_encodes_decodes_and_renders_chats_like_ours(tmp_path):
    tok = small_tokenizer()
    model_dir(tmp_path / "ours")
    export_hf(tmp_path / "ours", tmp_path / "hf")
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "To be, or not to be: that is the question.\n  def f(x):\n\treturn x ** 2  # 123456"
    assert hf_tok(text)["input_ids"] == [tok.eot_id] + tok.encode(text) == tok.prefix_ids + tok.encode(text)
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
    assert hf_tok.decode(tok.encode(text)) == text
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == (tok.bos_id, tok.eot_id, tok.pad_id)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "5"}, {"role": "user", "content": "And 2+4?"}]
    rendered = hf_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(rendered) == tok.render_chat(chat, add_generation_prompt=True)[0]  # no prefix: add_special_tokens=False
    gen_cfg = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen_cfg["eos_token_id"] == [tok.eot_id, tok.end_of_turn_id]


@pytest.mark.parametrize("variant", ["llama_untied_bias_linear_rope", "qwen2_qkv_bias", "mixtral", "deepseek_v3",
                                     "gemma2"])
def test_export_then_import_is_exact(tmp_path, variant):
    model = _randomised(**EXPORTABLE[variant][0])
    if variant == "gemma2":  # Gemma stores norms as w - 1: exact while w stays in [0.5, 2] (Sterbenz)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.clamp_(0.5, 2.0)
    model_dir(tmp_path / "ours", model)
    export_hf(tmp_path / "ours", tmp_path / "hf")
    arch, no_tokenizer = import_hf(tmp_path / "hf", tmp_path / "back")
    again = load_model(tmp_path / "back")
    assert no_tokenizer is None and again.cfg == model.cfg
    theirs = again.state_dict()
    for name, t in model.state_dict().items():
        assert torch.equal(t, theirs[name]), name
    assert (tmp_path / "back" / "tokenizer" / "tokenizer.json").read_text() == small_tokenizer().to_json()


def test_import_reads_a_config_without_groundup_fields_and_bf16_weights(tmp_path):
    model = _randomised(tie_embeddings=False, qk_norm=True)
    model_dir(tmp_path / "ours", model)
    export_hf(tmp_path / "ours", tmp_path / "hf", dtype="bfloat16")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["groundup_model_config"]  # as a model from the Hub would be
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    (tmp_path / "hf" / "tokenizer.json").write_text('{"model": {"type": "Unigram"}}')  # malformed: no vocabulary
    _, no_tokenizer = import_hf(tmp_path / "hf", tmp_path / "back")  # a bad tokenizer does not stop the import
    assert "tokenizer.json: model.vocab: expected a list of [piece, score], got null" in no_tokenizer
    assert not (tmp_path / "back" / "tokenizer").exists()
    again = load_model(tmp_path / "back")
    assert again.embed.weight.dtype == torch.bfloat16 and again.cfg.qk_norm and not again.cfg.tie_embeddings
    assert torch.equal(again.embed.weight, model.embed.weight.to(torch.bfloat16))
    tokens = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        assert (again.float()(tokens).logits - model(tokens).logits).abs().max() < 0.1


@pytest.mark.parametrize("overrides, message", [
    ({"norm": "layernorm", "bias": True, "mlp": "gelu"}, "norm = 'layernorm'"),
    ({"norm_placement": "post"}, "norm_placement = 'post'"),
    ({"mlp": "relu2"}, "mlp = 'relu2'"),
    ({"attn_logit_softcap": 5.0}, "attn_logit_softcap = 5.0"),
    ({"embed_scale": True}, "norm_placement = 'pre'"),
    ({"n_experts": 4, "moe_router": "sigmoid"}, "moe_router = 'sigmoid'"),
    ({"n_experts": 4, "n_shared_experts": 1}, "n_shared_experts = 1"),
    ({"n_experts": 4, "n_dense_layers": 1}, "n_dense_layers = 1"),
    ({**MLA}, "norm_eps = 1e-05"),
    ({"qk_norm": True, "bias": True}, "bias = True"),
    ({"qk_norm": True, "qkv_bias": True}, "qkv_bias = True"),
    ({"n_experts": 4, "qkv_bias": True}, "qkv_bias = True"),
])
def test_configurations_no_standard_architecture_expresses_are_refused_by_name(tmp_path, overrides, message):
    model_dir(tmp_path / "ours", tiny_model(**overrides))
    with pytest.raises(ConfigError, match=f"cannot export {message}"):
        export_hf(tmp_path / "ours", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_trained_selection_bias_is_refused_for_softmax_routers(tmp_path):
    model = tiny_model(n_experts=4, moe_top_k=2)
    model.moe_layers()[0].expert_bias[0] = 0.01
    model_dir(tmp_path / "ours", model)
    with pytest.raises(ConfigError, match="moe_bias_update_rate.*DeepSeek-V3"):
        export_hf(tmp_path / "ours", tmp_path / "hf")


def test_import_refuses_what_groundup_cannot_compute_and_pickles(tmp_path):
    model_dir(tmp_path / "ours")
    export_hf(tmp_path / "ours", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["groundup_model_config"]
    for change, message in [({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "not 'llama3'"),
                            ({"model_type": "mistral", "sliding_window": 16}, "sliding_window = 16"),
                            ({"attention_bias": True}, "mlp_bias = "),
                            ({"model_type": "gpt2"}, "model_type 'gpt2' is not importable")]:
        (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ConfigError, match=message):
            import_hf(tmp_path / "hf", tmp_path / "back")
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    (tmp_path / "hf" / "model.safetensors").rename(tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="loading a pickle can run code"):
        import_hf(tmp_path / "hf", tmp_path / "back")
    with pytest.raises(CheckpointError, match="not a Hugging Face model directory"):
        import_hf(tmp_path / "ours", tmp_path / "back")


def test_export_and_import_commands(tmp_path, capsys):
    from groundup.cli import main

    model_dir(tmp_path / "ours", tiny_model(seed=4))
    assert main(["export", "hf", "--checkpoint", str(tmp_path / "ours"), "--out", str(tmp_path / "hf")]) == 0
    assert "(llama)" in capsys.readouterr().out
    assert main(["import", "hf", "--model", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    assert "from a llama model" in capsys.readouterr().out
    assert Generator.from_checkpoint(tmp_path / "back").generate(["To be"], max_new_tokens=8, temperature=0) == \
        Generator.from_checkpoint(tmp_path / "ours").generate(["To be"], max_new_tokens=8, temperature=0)
    model_dir(tmp_path / "gpt2", tiny_model(norm="layernorm", bias=True, mlp="gelu"))
    assert main(["export", "hf", "--checkpoint", str(tmp_path / "gpt2"), "--out", str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot export norm = 'layernorm'") and "Traceback" not in err


# ----------------------------------------------------------------------------- Foundations part 3


def test_exported_tokenizer_puts_end_of_text_before_a_prompt_like_groundup(tmp_path):
    """AutoTokenizer's defaults give the context groundup gives (<|end_of_text|> first), so greedy
    transformers generation continues a plain prompt exactly as the model does here."""
    tok = small_tokenizer()
    model = _randomised(tie_embeddings=False)
    model_dir(tmp_path / "ours", model)
    export_hf(tmp_path / "ours", tmp_path / "hf")
    hf, hf_tok = _load_hf(tmp_path / "hf"), transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = hf_tok("KING HENRY.")["input_ids"]
    assert ids == [tok.eot_id] + tok.encode("KING HENRY.") == tok.prefix_ids + tok.encode("KING HENRY.")
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        row, argmax = list(ids), []
        for _ in range(12):  # greedy by plain forward passes, independent of the generation engine
            argmax.append(int(model(torch.tensor([row])).logits[0, -1].argmax()))
            row.append(argmax[-1])
            if argmax[-1] in tok.stop_ids:
                break
    assert out[: len(argmax)] == argmax
    assert Generator(model, tok).complete(["KING HENRY."], max_new_tokens=12, temperature=0)[0].token_ids == argmax
    # Files written before the post-processor existed still load, with the same hash.
    data = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())
    data["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(data))
    from groundup.tokenizer import Tokenizer

    assert Tokenizer.load(tmp_path / "hf").hash == tok.hash


def _foreign_hf_dir(tmp_path, model):
    """An exported model whose tokenizer is swapped for a Hugging Face (ChatML, Qwen-style) one."""
    from test_tokenizer_hf import hf_dir

    model_dir(tmp_path / "ours", model)
    export_hf(tmp_path / "ours", tmp_path / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "groundup_tokenizer.json"):
        (tmp_path / "hf" / name).unlink()
    source = hf_dir(tmp_path / "chatml", "chatml")
    for f in source.iterdir():
        (tmp_path / "hf" / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    config["eos_token_id"] = [1, 2]  # a model's own stop list reaches the tokenizer's stop ids
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps(config))
    return source


def test_import_hf_brings_a_hugging_face_tokenizer_and_export_copies_it_back(tmp_path):
    from groundup.tokenizer import load_tokenizer
    from groundup.tokenizer.hf_tokenizer import HFTokenizer

    model = _randomised(vocab_size=768, qkv_bias=True)
    source = _foreign_hf_dir(tmp_path, model)
    arch, no_tokenizer = import_hf(tmp_path / "hf", tmp_path / "back")
    assert arch == "qwen2" and no_tokenizer is None
    tok, original = load_tokenizer(tmp_path / "back" / "tokenizer"), load_tokenizer(source)
    assert isinstance(tok, HFTokenizer) and tok.hash == original.hash and tok.stop_ids == {1, 2, tok.eot_id}
    back = load_model(tmp_path / "back")
    chat = [{"role": "user", "content": "Who is there?"}]
    ids, _ = tok.render_chat(chat, add_generation_prompt=True)
    reply = Generator(back, tok).generate_ids([ids], max_new_tokens=6, temperature=0)[0]
    assert 0 < len(reply) <= 6
    export_hf(tmp_path / "back", tmp_path / "hf2")  # the imported model goes out with its own tokenizer files
    assert (tmp_path / "hf2" / "tokenizer.json").read_text() == (source / "tokenizer.json").read_text()
    assert json.loads((tmp_path / "hf2" / "generation_config.json").read_text())["eos_token_id"] == sorted(tok.stop_ids)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf2")
    assert list(hf_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)) == ids
    assert hf_tok("KING HENRY.")["input_ids"] == tok.prefix_ids + tok.encode("KING HENRY.")
    config = json.loads((tmp_path / "hf2" / "config.json").read_text())
    assert config["eos_token_id"] == tok.eot_id and config["bos_token_id"] is None


def test_a_bad_hugging_face_tokenizer_does_not_stop_the_import(tmp_path):
    _foreign_hf_dir(tmp_path, _randomised(vocab_size=768))
    (tmp_path / "hf" / "tokenizer_config.json").write_text('{"eos_token": "<|missing|>"}')
    _, no_tokenizer = import_hf(tmp_path / "hf", tmp_path / "back")
    assert "eos_token '<|missing|>' is not in the vocabulary" in no_tokenizer
    assert (tmp_path / "back" / "model.safetensors").is_file() and not (tmp_path / "back" / "tokenizer").exists()


def test_qwen2_config_from_the_hub_is_imported(tmp_path):
    model = _randomised(qkv_bias=True, tie_embeddings=True)
    model_dir(tmp_path / "ours", model)
    assert export_hf(tmp_path / "ours", tmp_path / "hf") == "qwen2"
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["groundup_model_config"]
    config.update(sliding_window=32768, use_sliding_window=False, max_window_layers=21)  # as Qwen2.5's config.json
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    import_hf(tmp_path / "hf", tmp_path / "back")
    again = load_model(tmp_path / "back")
    assert again.cfg.qkv_bias and not again.cfg.bias
    assert all(torch.equal(t, again.state_dict()[k]) for k, t in model.state_dict().items())


def test_out_directories_are_never_replaced_silently(tmp_path, capsys):
    from groundup.cli import main
    from groundup.errors import DataError

    model_dir(tmp_path / "ours", tiny_model(seed=5))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("keep me")
    export = ["export", "hf", "--checkpoint", str(tmp_path / "ours")]
    assert main(export + ["--out", str(tmp_path / "taken")]) == 2
    assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "keep me"
    assert main(export + ["--out", str(tmp_path / "taken"), "--overwrite"]) == 0
    assert not (tmp_path / "taken" / "notes.txt").exists()
    for out in (tmp_path / "ours", tmp_path):  # the checkpoint itself, or a directory holding it: never
        assert main(export + ["--out", str(out), "--overwrite"]) == 2
        assert "which this command reads" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(export + ["--out", str(tmp_path / "empty")]) == 0  # an empty directory is fine
    assert main(["import", "hf", "--model", str(tmp_path / "empty"), "--out", str(tmp_path / "taken")]) == 2
    assert "holds the output of 'groundup export hf'; 'groundup import hf'" in capsys.readouterr().err
    assert main(["import", "hf", "--model", str(tmp_path / "empty"), "--out", str(tmp_path / "taken"),
                 "--overwrite"]) == 0
    with pytest.raises(DataError, match="which this command reads"):
        import_hf(tmp_path / "empty", tmp_path / "empty", overwrite=True)
