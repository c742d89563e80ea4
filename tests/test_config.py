"""The configuration system: TOML, dotted overrides, presets and the errors users see."""

from __future__ import annotations

import pytest

from groundup.config import ConfigError, config_diff, from_dict, load_config, save_config
from groundup.model import ModelConfig


def test_toml_then_overrides_then_validation(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('preset = "tiny"\nn_layers = 3\nqk_norm = true\n')
    cfg = load_config(ModelConfig, path, ["n_layers=4", "mlp=geglu", "rope_theta=5e5"])
    assert (cfg.name, cfg.n_layers, cfg.qk_norm, cfg.mlp, cfg.d_model) == ("tiny", 4, True, "geglu", 64)
    assert cfg.rope_theta == 500000.0


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = from_dict(ModelConfig, {"preset": "deepseek-v2-lite"})
    save_config(cfg, tmp_path / "model.toml")
    again = load_config(ModelConfig, tmp_path / "model.toml")
    assert again == cfg
    assert config_diff(cfg, again) == []


@pytest.mark.parametrize("data, message", [
    ({"n_head": 4}, "unknown key 'n_head' (did you mean 'n_heads'?)"),
    ({"d_model": "big"}, "d_model = 'big': expected an integer"),
    ({"qk_norm": 1}, "qk_norm = 1: expected true or false"),
    ({"mlp": "swiglo"}, "mlp = 'swiglo': expected one of 'swiglu', 'geglu', 'gelu', 'relu2' (did you mean 'swiglu'?)"),
    ({"n_heads": 8, "n_kv_heads": 3}, "n_kv_heads = 3: expected a divisor of n_heads (8)"),
    ({"d_model": 100, "n_heads": 8}, "n_heads = 8: expected a divisor of d_model (100)"),
    ({"d_model": 72, "n_heads": 8}, "expected an even head dimension for RoPE"),
    ({"preset": "ladder-100"}, "unknown preset (did you mean 'ladder-100m'?)"),
    ({"n_experts": 4, "moe_top_k": 5}, "moe_top_k = 5: expected between 1 and n_experts (4)"),
    ({"attention": "mla", "qk_rope_head_dim": 7}, "qk_rope_head_dim = 7: expected an even number"),
])
def test_bad_values_fail_naming_key_value_and_expectation(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(ModelConfig, data)
    assert message in str(err.value)


def test_nested_sections_prefix_their_keys():
    from dataclasses import dataclass, field

    @dataclass
    class Run:
        model: ModelConfig = field(default_factory=ModelConfig)
        steps: int = 10

    with pytest.raises(ConfigError, match=r"^model.n_kv_heads = 5: expected a divisor"):
        load_config(Run, None, ["model.n_kv_heads=5"])
    with pytest.raises(ConfigError, match="unknown key 'model.n_layer' \\(did you mean 'model.n_layers'\\?\\)"):
        load_config(Run, None, ["model.n_layer=5"])
    with pytest.raises(ConfigError, match="unknown key 'stepz'"):
        load_config(Run, None, ["stepz=5"])
    run = load_config(Run, None, ["model.preset=tiny", "steps=1e3"])
    assert run.steps == 1000 and run.model.d_model == 64


def test_bad_toml_and_missing_file_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("n_layers = = 3\n")
    with pytest.raises(ConfigError, match="bad.toml: invalid TOML"):
        load_config(ModelConfig, bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(ModelConfig, tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="expected the form section.key=value"):
        load_config(ModelConfig, None, ["n_layers"])
