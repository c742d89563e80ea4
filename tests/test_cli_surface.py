"""One command-line surface: every verb resolves and is listed in data-flow order, the shared flags are spelled
one way (the old spellings kept as aliases), every configurable verb prints its keys with --print-config and
refuses a stray key with a did-you-mean."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import stat
import tomllib
import typing

import pytest

from groundup.arguments import config_class
from groundup.cli import COMMANDS, _load, find_command, main
from groundup.config import load_config
from groundup.errors import ConfigError


def _parser(command) -> argparse.ArgumentParser:
    _, add_arguments = _load(command.target)
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def _configurable() -> dict[str, type]:
    """Verb -> its config class, for every verb whose parser declares one."""
    found = {}
    for c in COMMANDS:
        default = _parser(c).get_default("config_class")
        if default:
            found[" ".join(c.words)] = config_class(argparse.Namespace(config_class=default))
    return found


CONFIGURABLE = ["arena", "data curate", "tokenizer train", "data tokenize", "plan", "train", "sft", "dpo", "kto",
                "reward-model", "grpo", "rft", "demo"]


def test_every_command_and_alias_resolves():
    for c in COMMANDS:
        run, _ = _load(c.target)
        assert callable(run) and _parser(c) is not None
        for words in (c.words, *c.aliases):
            assert find_command([*words, "--help"]) == (c, len(words))
    assert find_command(["rm"])[0].words == ("reward-model",)
    assert find_command(["merge"])[0].words == ("merge-lora",)
    assert find_command(["eval", "contamination"])[0].words == ("eval", "contamination")


def test_help_lists_every_verb_once_in_data_flow_order(capsys):
    assert main(["--help"]) == 0
    listed = [line.split("  ")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    names = [" ".join(c.words) for c in COMMANDS]
    assert [n for n in listed if n in names] == names
    flow = ["data curate", "tokenizer train", "data tokenize", "train", "sft", "data pairs", "dpo", "grpo",
            "generate", "eval", "quantize", "export gguf"]
    assert sorted(flow, key=names.index) == flow


@pytest.mark.parametrize("verb, old, new", [
    (["generate"], ["--checkpoint", "m"], ["--model", "m"]),
    (["serve"], ["--checkpoint", "m"], ["--model", "m"]),
    (["eval"], ["--checkpoint", "m"], ["--model", "m"]),
    (["quantize", "--method", "int8"], ["--checkpoint", "m"], ["--model", "m"]),
    (["export", "hf", "--out", "o"], ["--checkpoint", "m"], ["--model", "m"]),
    (["sft", "--out", "o"], ["--base", "m"], ["--model", "m"]),
    (["grpo", "--out", "o"], ["--base", "m"], ["--model", "m"]),
    (["merge-lora", "--adapter", "a", "--out", "o"], ["--base", "m"], ["--model", "m"]),
    (["data", "curate", "--input", "i", "--out", "o"], ["--no-progress"], ["--quiet"]),
    (["eval", "--model", "m"], ["--no-progress"], ["--quiet"]),
    (["data", "pairs", "--model", "m", "--prompts", "p", "--reward", "exact_match"], ["--no-progress"], ["--quiet"]),
])
def test_old_spellings_mean_the_same_as_the_new(verb, old, new):
    command, n = find_command(verb)
    p = _parser(command)
    assert vars(p.parse_args([*verb[n:], *old])) == vars(p.parse_args([*verb[n:], *new]))


def test_the_model_loading_flags_are_one_set_with_one_device_default():
    for name in ("generate", "chat", "serve", "eval", "quantize", "data pairs"):
        command, n = find_command(name.split())
        dests = {a.dest: a.default for a in _parser(command)._actions}
        assert dests["model"] is None and dests["device"] == "auto" and dests["tokenizer"] is None, name


def test_resume_takes_one_path_in_either_form():
    command, _ = find_command(["train"])
    p = _parser(command)
    from groundup.arguments import resolve_output

    assert resolve_output(p.parse_args(["--resume", "runs/a"])) == resolve_output(
        p.parse_args(["--out", "runs/a", "--resume"]))
    assert resolve_output(p.parse_args(["--out", "runs/b"]))[1] is False
    with pytest.raises(ConfigError, match="name two outputs"):
        resolve_output(p.parse_args(["--out", "runs/a", "--resume", "runs/b"]))
    with pytest.raises(ConfigError, match="--out PATH"):
        resolve_output(p.parse_args([]))


def test_the_configurable_verbs_are_the_expected_ones():
    assert sorted(_configurable()) == sorted(CONFIGURABLE)


def _keys(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _keys(tp, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


@pytest.mark.parametrize("verb", CONFIGURABLE)
def test_print_config_is_every_key_with_its_meaning_and_loads_back(verb, capsys, tmp_path):
    cls = _configurable()[verb]
    assert main([*verb.split(), "--print-config"]) == 0
    text = capsys.readouterr().out
    data = tomllib.loads(text)
    assert load_config(cls, None) == load_config(cls, _write(tmp_path / "c.toml", text))
    lines = {line.split(" = ")[0].lstrip("# "): line for line in text.splitlines() if " = " in line}
    for key in _keys(cls):
        leaf = key.rsplit(".", 1)[-1]
        assert leaf in lines, f"{verb}: {key} is not printed"
    undescribed = [k for k, line in lines.items() if "  # " not in line]
    assert not undescribed, f"{verb}: keys printed without a description: {undescribed}"
    assert data  # parses as TOML


def _write(path, text):
    path.write_text(text)
    return path


def test_print_config_shows_the_file_and_overrides_applied(capsys):
    assert main(["train", "--print-config", "train.max_steps=7", "optim.name=muon"]) == 0
    data = tomllib.loads(capsys.readouterr().out)
    assert data["train"]["max_steps"] == 7 and data["optim"]["name"] == "muon"


@pytest.mark.parametrize("verb", CONFIGURABLE)
def test_a_stray_key_fails_with_a_did_you_mean(verb):
    cls = _configurable()[verb]
    keys = list(_keys(cls))
    key = next((k for k in keys if "." in k), keys[0])
    with pytest.raises(ConfigError, match=f"unknown key '{key}x'.*did you mean '{key}'"):
        load_config(cls, None, [f"{key}x=1"])


@pytest.mark.parametrize("verb", ["sft", "dpo", "kto", "reward-model", "grpo", "rft"])
def test_keys_that_do_not_apply_to_post_training_are_refused(verb):
    cls = _configurable()[verb]
    with pytest.raises(ConfigError, match="unknown key 'model.n_layers': post-training trains the base model"):
        load_config(cls, None, ["model.n_layers=4"])
    with pytest.raises(ConfigError, match="unknown key 'data.shards'.*sft.replay_shards"):
        load_config(cls, None, ['data.shards="tokens"'])
    with pytest.raises(ConfigError, match="unknown key 'eval.max_batches'"):
        load_config(cls, None, ["eval.max_batches=2"])
    if verb == "grpo":
        for key in ("train.batch_size", "train.seq_len"):
            with pytest.raises(ConfigError, match=f"unknown key '{key}'"):
                load_config(cls, None, [f"{key}=4"])


def test_a_stray_key_on_the_command_line_is_one_clear_line(tmp_path, capsys):
    assert main(["sft", "--out", str(tmp_path / "r"), "train.max_stepz=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'train.max_stepz' (did you mean 'train.max_steps'?)" in err and "Traceback" not in err


def test_written_directories_and_safetensors_follow_the_umask(tmp_path):
    from groundup.io import UMASK, atomic_dir, follow_umask

    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "f").write_text("x")
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o777 & ~UMASK
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(1)}, str(tmp_path / "w.safetensors"))
    assert stat.S_IMODE(os.stat(tmp_path / "w.safetensors").st_mode) == 0o600  # what safetensors does on its own
    follow_umask(tmp_path / "w.safetensors")
    assert stat.S_IMODE(os.stat(tmp_path / "w.safetensors").st_mode) == 0o666 & ~UMASK
