"""The one run session every training verb opens (train/session.py): what it resolves and writes."""

from __future__ import annotations

import json
import tomllib

import pytest

from groundup.config import load_config, saved_config, to_toml
from groundup.posttrain.config import GRPOConfig, SFTConfig
from groundup.posttrain.sft import sft
from groundup.train import TrainConfig, train
from infer_helpers import model_dir, small_tokenizer, tiny_model
from train_helpers import metrics, run_cli, shared_shards, tiny_config


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("session")
    model_dir(root / "base", tiny_model(max_seq_len=96), small_tokenizer())
    run_cli("data", "sample", "--chat", "--out", str(root / "chat"), "--domains", "math", "--math-count", "100")
    return root


def _sft(root, *extra):
    return load_config(SFTConfig, None, [f"base={json.dumps(str(root / 'base'))}",
                                         f"sft.data={json.dumps([str(root / 'chat' / 'chat-math.jsonl')])}",
                                         "train.batch_size=4", "train.max_steps=2", "log.progress=false",
                                         "eval.at_end=false", "sft.eval_generations=0", *extra])


def test_post_training_rows_default_to_the_base_models_context(base, tmp_path):
    assert SFTConfig().train.seq_len == 0
    sft(_sft(base), tmp_path / "run")
    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["train"]["seq_len"] == 96 and "model" not in saved and "data" not in saved
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["rows"] > 0
    with pytest.raises(Exception, match="train.seq_len = 200: the base model's context is 96"):
        sft(_sft(base, "train.seq_len=200"), tmp_path / "long")


def test_a_short_run_logs_its_first_step(tmp_path_factory, tmp_path):
    shards, _ = shared_shards(tmp_path_factory)
    train(tiny_config(shards, "train.max_steps=3", "log.every=10", "eval.at_end=false"), tmp_path / "run")
    assert [r["step"] for r in metrics(tmp_path / "run")[0]] == [1, 3]


def test_a_run_saved_before_configs_were_composed_still_resumes():
    """config.toml of a post-training run written when its config held pretraining's [model] and [data]."""
    old = {"base": "b", "model": {"n_layers": 2}, "data": {"shards": "tok", "tokenizer": ""},
           "train": {"seq_len": 128, "batch_size": 4}, "eval": {"every": 5, "max_batches": 20},
           "stability": {"repeat_ngram": 13, "spike_factor": 4.0}, "sft": {"replay_fraction": 0.2}}
    cfg = saved_config(SFTConfig, old)
    assert cfg.sft.replay_shards == "tok" and cfg.train.seq_len == 128 and cfg.eval.every == 5
    assert cfg.stability.spike_factor == 4.0
    grpo = saved_config(GRPOConfig, {"base": "b", "model": {}, "train": {"seq_len": 128, "max_steps": 3}})
    assert grpo.train.max_steps == 3
    # What is saved now reads back as it is.
    assert saved_config(SFTConfig, tomllib.loads(to_toml(cfg))) == cfg
    assert saved_config(TrainConfig, tomllib.loads(to_toml(TrainConfig()))) == TrainConfig()
