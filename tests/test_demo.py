"""A micro demo: every stage end to end on a slice of the embedded corpus, in well under a minute."""

from __future__ import annotations

import json

import pytest

from groundup.cli import main

MICRO = ["limit_per_source=40", "math_count=300", "chunk_chars=3000", "probe_steps=2", "min_steps=30", "evals=2",
         "reserve_seconds=0", "tokenizer.vocab_size=400", "pretrain.model.d_model=64", "pretrain.model.n_layers=2",
         "pretrain.model.n_heads=4", "pretrain.model.d_ff=128", "pretrain.model.max_seq_len=64",
         "pretrain.train.seq_len=64", "pretrain.train.batch_size=8", "pretrain.eval.max_batches=2",
         "pretrain.schedule.peak_lr=1e-2", "samples.max_new_tokens=8", "tokenize.val_fraction=0.1",
         "tokenizer.holdout_fraction=0.1",
         # A 40-chunk slice holds one or two works: holding out whole works would leave no text on one side.
         'tokenize.split_group=""', 'tokenizer.holdout_group=""']


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--out", str(out), "--budget-minutes", "0.05", *MICRO]) == 0
    return out


def test_every_stage_leaves_its_output(demo_dir):
    for path in ("raw/shakespeare.jsonl", "curated/report.json", "curated/shards", "tokenizer/tokenizer.json",
                 "tokens/index.json", "run/metrics.jsonl", "run/checkpoints/latest", "model/model.safetensors",
                 "model/model.toml", "model/tokenizer/tokenizer.json", "eval.json", "samples.json",
                 "report.md", "plots/loss.png", "commands.sh", "configs/pretrain.toml"):
        assert (demo_dir / path).exists(), path
    stages = json.loads((demo_dir / "stages.json").read_text())
    assert all(v["status"] == "done" for v in stages.values())
    assert list(stages) == ["sample", "curate", "tokenizer", "tokenize", "probe", "pretrain", "export_model",
                            "evaluate", "samples"]


def test_validation_loss_fell_and_the_report_shows_every_section(demo_dir):
    evals = [json.loads(line) for line in (demo_dir / "run" / "metrics.jsonl").read_text().splitlines()
             if "val_loss" in line]
    assert len(evals) >= 2 and evals[-1]["val_loss"] < evals[0]["val_loss"]
    report = (demo_dir / "report.md").read_text()
    for heading in ("## Time per stage", "## Curation", "## Tokenizer and token shards", "## Model", "## Training",
                    "## Evaluation", "## Samples", "![loss](plots/loss.png)"):
        assert heading in report
    result = json.loads((demo_dir / "eval.json").read_text())
    assert set(result["domains"]) == {"text", "code", "math"} and result["bpb"] > 0


def test_a_second_run_reuses_finished_stages(demo_dir, capsys):
    assert main(["demo", "--out", str(demo_dir), "--budget-minutes", "0.05", *MICRO]) == 0
    err = capsys.readouterr().err
    assert err.count("reusing finished stage") == 9


def test_the_demo_model_works_with_generate(demo_dir, capsys):
    assert main(["generate", "--checkpoint", str(demo_dir / "model"), "--prompt", "ROMEO.", "--max-new-tokens", "4",
                 "--temperature", "0"]) == 0
    assert "ROMEO." in capsys.readouterr().out
