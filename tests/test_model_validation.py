"""Corrupt or mismatched models and out-of-range settings are refused in one line that names the file,
tensor, key or flag (issue 28): non-finite weights in every verb that reads weights, NaN scores in eval,
Hugging Face and peft configs of the wrong shape, an adapter made for a base of another shape, devices
this machine lacks, a custom task whose data leaves its folder, and values out of range."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from groundup.cli import main
from groundup.config import ConfigError, load_config
from groundup.device import resolve_device
from groundup.errors import CheckpointError, DataError
from groundup.eval.metrics import choice_metrics
from infer_helpers import model_dir, small_tokenizer, tiny_model

BROKEN = "blocks.1.mlp.down_proj.weight"
ITEMS = [{"q": f"Is {i} a number?", "options": ["yes", "no", "maybe"], "answer": 0} for i in range(3)]


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def nan_model():
    model = tiny_model()
    with torch.no_grad():
        getattr(model.blocks[1].mlp.down_proj, "weight")[3, 5] = float("nan")
    return model


def task_file(folder, records=ITEMS, **keys):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    keys = {"name": "yesno", "data": "items.jsonl", "context": "Q: {q}\\nA:", "choices": "options", "gold": "answer",
            **keys}
    (folder / "task.toml").write_text("".join(f'{k} = "{v}"\n' for k, v in keys.items()))
    return folder / "task.toml"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("good") / "model")


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("broken") / "model", nan_model())


# ----------------------------------------------------------------------------- non-finite weights


@pytest.mark.parametrize("verb", ["quantize", "export gguf", "export hf", "eval", "generate"])
def test_every_verb_that_reads_weights_refuses_nan_naming_the_tensor(broken, tmp_path, capsys, verb):
    out = tmp_path / "out"
    args = {"quantize": ["quantize", "--method", "int8", "--out", out],
            "export gguf": ["export", "gguf", "--out", out],
            "export hf": ["export", "hf", "--out", out],
            "eval": ["eval", "--tasks", task_file(tmp_path / "task"), "--out", out, "--no-progress"],
            "generate": ["generate", "--prompt", "To be", "--max-new-tokens", "2"]}[verb]
    code, _, err = cli(capsys, *args[:2 if verb.startswith("export") else 1], "--model", broken,
                       *args[2 if verb.startswith("export") else 1:])
    assert code == 2 and err.count("\n") == 1
    assert f"tensor {BROKEN} holds non-finite values (1 NaN" in err and "model.safetensors" in err
    assert not out.exists()


def test_weights_that_overflow_float16_are_refused_not_loaded_as_infinity(tmp_path):
    from groundup.errors import CheckpointError
    from groundup.model.model_dir import load_float_model

    model = tiny_model()
    with torch.no_grad():
        model.blocks[1].mlp.down_proj.weight[0, 0] = 1e5  # finite in float32, infinite in float16
    path = model_dir(tmp_path / "model", model)
    assert load_float_model(path, dtype=torch.bfloat16) is not None  # bfloat16 has float32's range
    with pytest.raises(CheckpointError, match=f"tensor {BROKEN} does not fit in float16"):
        load_float_model(path, dtype=torch.float16)


def test_import_gguf_and_hf_refuse_non_finite_tensors_naming_them(good, tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "model.gguf"
    assert cli(capsys, "export", "gguf", "--model", good, "--type", "f32", "--out", path)[0] == 0
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.1.ffn_down.weight")
    with open(path, "r+b") as f:  # one float32 of that tensor becomes +inf
        f.seek(int(tensor.data_offset) + 4 * 7)
        f.write(np.array([np.inf], dtype=np.float32).tobytes())
    code, _, err = cli(capsys, "import", "gguf", path, "--out", tmp_path / "back")
    assert code == 2 and "tensor blk.1.ffn_down.weight holds non-finite values (0 NaN, 1 infinite" in err
    assert not (tmp_path / "back").exists()

    assert cli(capsys, "export", "hf", "--model", good, "--out", tmp_path / "hf")[0] == 0
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    weights["model.layers.0.self_attn.o_proj.weight"][0, 0] = float("nan")
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    code, _, err = cli(capsys, "import", "hf", "--model", tmp_path / "hf", "--out", tmp_path / "back")
    assert code == 2 and "tensor model.layers.0.self_attn.o_proj.weight holds non-finite values (1 NaN" in err


def test_nan_log_likelihoods_never_count_as_right(tmp_path):
    from groundup.benchmarks import resolve_tasks
    from groundup.eval.harness import EvalSettings, evaluate_task

    # argmax over [nan, nan, nan] is choice 0, the gold of every item: accuracy 1.0 for a broken model
    assert choice_metrics([math.nan] * 3, ["yes", "no", "maybe"], 0) == {"acc": 0.0, "acc_norm": 0.0, "acc_bytes": 0.0}
    assert choice_metrics([-math.inf, -math.inf], ["yes", "no"], 0)["acc"] == 0.0
    task, = resolve_tasks(str(task_file(tmp_path)))
    result = evaluate_task(nan_model(), small_tokenizer(), task, EvalSettings(bootstrap_iters=0), progress=False)
    assert result["items"] == 3 and result["failed"] == 3 and result["scored"] == 0
    assert "non-finite log-likelihood (nan, nan, nan)" in result["failures"][0]["reason"]
    assert math.isnan(result["metrics"]["acc"]["value"])  # no number of nothing, and never 1.0


def test_eval_fails_when_no_item_of_a_task_can_be_scored(good, tmp_path, capsys):
    toml = task_file(tmp_path / "task", [{"q": "x", "options": [""], "answer": 0}] * 2, target_delimiter="")
    code, _, err = cli(capsys, "eval", "--model", good, "--tasks", toml, "--no-progress", "--out", tmp_path / "out")
    assert code == 2
    assert "error: task yesno: none of its 2 items could be scored (first: continuation '' encodes to no tokens)" in err
    assert "2 failed, first: continuation '' encodes to no tokens" in err  # the per-task line says why too
    assert json.loads((tmp_path / "out" / "results.json").read_text())["tasks"]["yesno"]["failed"] == 2


# ----------------------------------------------------------------------------- configs of the wrong shape


@pytest.mark.parametrize("change, message", [
    ({"rope_theta": [10000, 1]}, "rope_theta: expected a number or null, got [10000, 1]"),
    ({"rope_theta": "10000"}, "rope_theta: expected a number or null, got '10000'"),
    ({"sliding_window": "4096"}, "sliding_window: expected an integer or null, got '4096'"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: expected true or false or null, got 'yes'"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings: expected true or false or null, got 'false'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "rope_scaling.factor: expected a number"),
    ({"attention_bias": 0}, "attention_bias: expected true or false or null, got 0"),
])
def test_hf_config_of_the_wrong_shape_is_one_error_naming_file_and_key(good, tmp_path, change, message):
    from groundup.interop import export_hf, import_hf

    export_hf(good, tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    del config["groundup_model_config"]
    path.write_text(json.dumps({**config, **change}))
    with pytest.raises(DataError, match=f"{path}: {message}".replace("[", r"\[").replace("]", r"\]")):
        import_hf(tmp_path / "hf", tmp_path / "back")
    assert not (tmp_path / "back").exists()


@pytest.mark.parametrize("change, message", [
    ({"target_modules": 5}, "target_modules: expected a string or a list or null, got 5"),
    ({"target_modules": ["q_proj", 3]}, "target_modules: expected a string or a list or null"),
    ({"r": "8"}, "r: expected an integer or null, got '8'"),
    ({"use_rslora": "false"}, "use_rslora: expected true or false or null, got 'false'"),
    ({"lora_dropout": 1.5}, r"dropout = 1.5: expected a number in \[0, 1\)"),
])
def test_peft_adapter_config_of_the_wrong_shape_is_one_error(tmp_path, change, message):
    from groundup.interop.peft_format import adapter_config

    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], **change}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises((DataError, CheckpointError), match=f"adapter_config.json: {message}"):
        adapter_config(tmp_path)


# ----------------------------------------------------------------------------- adapters, devices, paths


def test_an_adapter_for_a_base_of_another_shape_is_one_line_in_merge_and_generate(good, tmp_path, capsys):
    from groundup.interop.peft_format import save_adapter
    from groundup.model.lora import LoraConfig, apply_lora

    wide = tiny_model(seed=1, d_model=96)
    apply_lora(wide, LoraConfig(rank=4))
    save_adapter(wide, LoraConfig(rank=4), tmp_path / "adapter", base=str(good))
    for args in (["merge-lora", "--adapter", tmp_path / "adapter", "--model", good, "--out", tmp_path / "merged"],
                 ["generate", "--model", good, "--adapter", tmp_path / "adapter", "--prompt", "hi"]):
        code, _, err = cli(capsys, *args)
        assert code == 2 and err.count("\n") == 1, err[-2000:]
        assert "does not fit this model: blocks.0.attn.qkv_proj.lora_A is (12, 96), this model's adapter there " \
               "is (12, 64)" in err
    assert not (tmp_path / "merged").exists()


@pytest.mark.parametrize("args", [["quantize", "--method", "int8", "--device", "xla:0"],
                                  ["serve", "--device", "mps"], ["generate", "--prompt", "hi", "--device", "cuda:x"]])
def test_devices_this_machine_cannot_run_are_one_line_naming_the_flag(good, tmp_path, capsys, args):
    code, _, err = cli(capsys, args[0], "--model", good, *args[1:])
    device = args[-1]
    assert code == 2 and err.count("\n") == 1
    assert f"error: --device {device!r}: " in err and "available here: auto, cpu" in err


def test_a_gpu_index_the_machine_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match=r"train.device = 'cuda:3': this machine has 1 CUDA device\(s\); "
                                          "available here: auto, cpu, cuda:0"):
        resolve_device("cuda:3", key="train.device")


@pytest.mark.parametrize("key", ["data", "fewshot_data"])
def test_a_custom_task_cannot_read_files_outside_its_folder(good, tmp_path, capsys, key):
    from groundup.benchmarks.custom import load_custom_task

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret.jsonl").write_text(json.dumps(ITEMS[0]) + "\n")
    toml = task_file(tmp_path / "tasks", **{key: "../elsewhere/secret.jsonl"})
    with pytest.raises(ConfigError, match=f"task.toml: {key} = '../elsewhere/secret.jsonl' resolves to "
                                          ".*outside the task file's folder"):
        load_custom_task(toml)
    (tmp_path / "tasks" / "link.jsonl").symlink_to(tmp_path / "elsewhere" / "secret.jsonl")  # a link out: the same
    toml = task_file(tmp_path / "tasks", **{key: "link.jsonl"})
    code, _, err = cli(capsys, "eval", "--model", good, "--tasks", toml, "--no-progress")
    assert code == 2 and f"{key} = 'link.jsonl' resolves to" in err and "outside the task file's folder" in err
    (tmp_path / "tasks" / "sub").mkdir()
    (tmp_path / "tasks" / "sub" / "items.jsonl").write_text(json.dumps(ITEMS[0]) + "\n")
    assert load_custom_task(task_file(tmp_path / "tasks", data="sub/items.jsonl")).name == "yesno"  # inside: fine


# ----------------------------------------------------------------------------- values out of range


@pytest.mark.parametrize("value", ["-1", "0", "-0.5"])
@pytest.mark.parametrize("key", ["desirable_weight", "undesirable_weight"])
def test_kto_weights_must_be_positive(key, value):
    from groundup.posttrain.config import KTOConfig

    with pytest.raises(ConfigError, match=f"kto.{key} = {float(value)!r}: expected a positive weight"):
        load_config(KTOConfig, None, [f"kto.{key}={value}"])
    assert load_config(KTOConfig, None, [f"kto.{key}=1.5"]).kto.desirable_weight in (1.0, 1.5)


@pytest.mark.parametrize("flag, value, message", [
    ("--temperature", "-1", "temperature = -1.0: expected a number >= 0"),
    ("--temperature", "nan", "temperature = nan: expected a number >= 0"),
    ("--max-gen-tokens", "0", "max_gen_tokens = 0: expected at least 1"),
    ("--sandbox-timeout", "0", "sandbox_timeout = 0.0: expected a positive number of seconds"),
])
def test_eval_refuses_out_of_range_generation_settings_before_loading(tmp_path, capsys, flag, value, message):
    code, _, err = cli(capsys, "eval", "--model", tmp_path / "no-such-model", "--tasks", "gsm8k", flag, value)
    assert code == 2 and f"error: {message}" in err


@pytest.mark.parametrize("tokens", ["nan", "inf", "1e400", "0", "-5", "nanB"])
def test_plan_refuses_a_token_count_that_is_not_a_positive_number(capsys, tokens):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--tokens", tokens])
    assert e.value.code == 2 and "argument --tokens" in capsys.readouterr().err
