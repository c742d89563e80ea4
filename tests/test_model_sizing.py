"""Parameter counts, FLOPs and KV bytes against hand-computed values, and `model info`."""

from __future__ import annotations

import json

import pytest

from conftest import tiny_config
from groundup.cli import main
from groundup.config import from_dict
from groundup.model import ModelConfig
from groundup.model.sizing import flops_per_token, kv_bytes_per_token, model_summary, param_counts


def _preset(name):
    return from_dict(ModelConfig, {"preset": name})


def _dense_layer(d, hd, heads, kv_heads, ffn):
    attn = d * heads * hd * 2 + d * kv_heads * hd * 2
    return attn + 3 * d * ffn + 2 * d  # q, o, k, v; SwiGLU gate/up/down; two RMSNorms


@pytest.mark.parametrize("name, layers, d, hd, heads, kv, ffn, vocab, tied", [
    ("clover-12b", 40, 5120, 160, 32, 8, 14336, 64000, False),
    ("llama3-8b", 32, 4096, 128, 32, 8, 14336, 128256, False),
    ("ladder-100m", 16, 640, 64, 10, 5, 1792, 32768, True),
    ("ladder-350m", 24, 1024, 64, 16, 8, 2816, 32768, False),
    ("ladder-1b", 20, 2048, 128, 16, 8, 5632, 32768, True),
    ("ladder-7b", 32, 4096, 128, 32, 8, 13824, 32768, False),
])
def test_dense_preset_parameter_counts_match_hand_computation(name, layers, d, hd, heads, kv, ffn, vocab, tied):
    expected = layers * _dense_layer(d, hd, heads, kv, ffn) + d + vocab * d * (1 if tied else 2)
    assert param_counts(_preset(name))["params_total"] == expected


def test_clover_12b_is_about_12b_parameters_and_24gb_in_bf16():
    s = model_summary(_preset("clover-12b"))
    assert 11.9e9 < s["params_total"] < 12.1e9
    assert 23.9e9 < s["weights_bytes_bf16"] < 24.2e9
    assert s["params_embedding"] == 2 * 64000 * 5120
    assert s["kv_bytes_per_token"] == 40 * 2 * 8 * 160 * 2  # layers * (K and V) * kv heads * head dim * bf16


def test_llama3_8b_matches_the_published_count():
    assert param_counts(_preset("llama3-8b"))["params_total"] == 8_030_261_248


def test_moe_active_parameters_count_only_top_k_experts():
    cfg = tiny_config(n_experts=8, moe_top_k=2, n_shared_experts=1, n_dense_layers=1)
    counts = param_counts(cfg)
    per_expert = 3 * 64 * 192
    assert counts["params_total"] - counts["params_active"] == (8 - 2) * per_expert  # one MoE layer


def test_flops_follow_the_palm_convention():
    cfg = tiny_config(tie_embeddings=False)
    counts = param_counts(cfg)
    n = counts["params_total"] - 256 * 64  # the input embedding is a lookup, not a matmul
    assert flops_per_token(cfg, seq_len=128) == 6 * n + 12 * 2 * 4 * 16 * 128


def test_mla_caches_far_less_than_gqa():
    lite = _preset("deepseek-v2-lite")
    assert kv_bytes_per_token(lite) == 27 * (512 + 64) * 2
    s = model_summary(lite)
    assert 15.5e9 < s["params_total"] < 16e9 and 2.4e9 < s["params_active"] < 2.8e9


def test_model_info_cli_prints_the_documented_json_keys(capsys):
    assert main(["model", "info", "clover-12b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("params_total", "params_active", "params_embedding", "flops_per_token", "weights_bytes_bf16",
                "kv_bytes_per_token"):
        assert key in data
    assert main(["model", "info", "tiny", "n_kv_heads=3"]) == 2
    assert "model.n_kv_heads = 3: expected a divisor of n_heads (4)" in capsys.readouterr().err


def test_model_info_reads_a_toml_file(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('[model]\npreset = "tiny"\nattention = "mla"\nkv_lora_rank = 32\nqk_nope_head_dim = 16\n'
                    'qk_rope_head_dim = 8\nv_head_dim = 16\n')
    assert main(["model", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(MLA)" in out and "4.0x less than multi-head attention" in out


def test_overrides_may_sit_on_both_sides_of_an_option(capsys):
    assert main(["model", "info", "tiny", "n_layers=3", "--json", "d_model=96"]) == 0
    split = json.loads(capsys.readouterr().out)
    assert main(["model", "info", "tiny", "n_layers=3", "d_model=96", "--json"]) == 0
    assert split == json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["model", "info", "tiny", "--json", "--no-such-flag"])
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
