"""A micro demo: every stage end to end on a slice of the embedded corpus, in about a minute.

The budget is tiny, so every training stage gets its least (a few steps, short_budget=run); what is
checked is the chain: each stage's output, the report card, reuse on a rerun, the time limits reaching
the verbs, SFT and alignment running on a spent budget, and the refusal of a budget too short (the
budget's arithmetic: tests/test_demo_budget.py).
"""

from __future__ import annotations

import json

import pytest

from groundup.cli import main

MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128, "max_seq_len": 1024}  # a tool-use chat is ~830 tokens of this tokenizer
MICRO = ["limit_per_source=40", "math_count=300", "chat_math_count=300", "chunk_chars=3000",
         "tokenizer.vocab_size=400", *[f"pretrain.model.{k}={v}" for k, v in MODEL.items()],
         "pretrain.train.seq_len=64", "pretrain.train.batch_size=8", "pretrain.eval.max_batches=2",
         "pretrain.schedule.peak_lr=1e-2", "samples.max_new_tokens=8", "tokenize.val_fraction=0.1",
         "tokenizer.holdout_fraction=0.1",
         "sft.train.seq_len=64", "sft.train.batch_size=8", "sft.sft.eval_generations=4",
         "sft.sft.eval_max_new_tokens=8",
         "grpo.grpo.group_size=2", "grpo.grpo.prompts_per_batch=2",
         "grpo.grpo.max_new_tokens=8", "grpo.grpo.eval_count=4",
         "scorecard.math_problems=8", "scorecard.chats_per_domain=2", "scorecard.mc_tasks=arc_easy",
         "scorecard.mc_items=8", "scorecard.max_new_tokens=40", "scorecard.bpb_batches=2", "scorecard.decode_tokens=8",
         "arena.prompts=2", "arena.battles_per_pair=2", "arena.max_tokens=8", "arena.bootstrap=20",
         # A 40-chunk slice holds one or two works: holding out whole works would leave no text on one side.
         'tokenize.split_group=""', 'tokenizer.holdout_group=""',
         "short_budget=run"]  # the budget is spent at once: run every stage for its few steps anyway
STAGES = ["sample", "chat", "tool_chat", "curate", "tokenizer", "tokenize", "untrained", "measure", "score_untrained", "pretrain", "export_base", "score_base", "samples",
          "sft", "export_sft", "score_sft", "align", "export_aligned", "score_aligned", "quantize",
          "score_aligned-int8", "arena"]
ROWS = ["untrained", "base", "sft", "aligned", "aligned-int8"]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--out", str(out), "--budget-minutes", "0.05", *MICRO]) == 0
    return out


def row(demo_dir, name):
    return json.loads((demo_dir / "scorecard" / f"{name}.json").read_text())


def test_every_stage_leaves_its_output(demo_dir):
    for path in ("raw/shakespeare.jsonl", "chat/chat-math.jsonl", "chat/chat-math.heldout.jsonl",
                 "curated/report.json", "tokenizer/tokenizer.json", "tokens/index.json", "run/metrics.jsonl",
                 "sft/metrics.jsonl", "align/metrics.jsonl", "samples.json", "report.md", "plots/loss.png",
                 "plots/sft_loss.png", "plots/align.png", "commands.sh", "budget.json", "configs/pretrain.toml",
                 "configs/sft.toml", "configs/grpo.toml", "arena/ratings.json", "arena/battles.jsonl", "arena-prompts.jsonl"):
        assert (demo_dir / path).exists(), path
    for name in ROWS:
        assert (demo_dir / "models" / name / "model.toml").is_file(), name
        assert (demo_dir / "models" / name / "tokenizer" / "tokenizer.json").is_file(), name
    stages = json.loads((demo_dir / "stages.json").read_text())
    assert list(stages) == STAGES and all(v["status"] == "done" for v in stages.values())
    assert all(v["threads"] >= 1 for v in stages.values())  # measured before each stage


def test_each_training_stage_ran_under_its_planned_time_limit(demo_dir):
    plans = json.loads((demo_dir / "budget.json").read_text())["plans"]
    assert set(plans) == {"pretrain", "sft", "align"}
    for stage, run in (("pretrain", "run"), ("sft", "sft"), ("align", "align")):
        summary = json.loads((demo_dir / run / "summary.json").read_text())
        assert summary["time_limit_s"] == plans[stage].get("final_seconds", plans[stage]["seconds"]) > 0
        assert plans[stage]["seconds"] >= plans[stage]["least"][stage] > 0
        assert summary["steps"] >= 1
    commands = (demo_dir / "commands.sh").read_text()
    assert "groundup sft" in commands and "groundup grpo" in commands and "--method int8" in commands
    assert "groundup arena --models untrained=" in commands and "judge_verdict_only=true" in commands


def test_the_report_card_has_a_row_per_model_with_every_measure(demo_dir):
    for name in ROWS:
        r = row(demo_dir, name)
        assert set(r["bpb"]) == {"text", "code", "math"} and all(v > 0 for v in r["bpb"].values())
        assert 0 <= r["end_turn"] <= 1 and 0 <= r["exact_match_strict"] <= r["exact_match_lenient"] <= 1
        assert r["math_problems"] == 8 and r["mc_items"] == 8 and set(r["mc_tasks"]) == {"arc_easy"}
        assert -3 <= r["mc_centered"] <= 1 and r["decode_tokens_per_s"] > 0
        # the tool row: held-out arithmetic asked with calculator and python, the model's calls run
        assert r["tool_problems"] == 8 and 0 <= r["tool_exact_match_strict"] <= 1
        assert 0 <= r["tool_called"] <= 1 and 0 <= r["tool_calls_ok"] <= 1
    assert row(demo_dir, "base")["native_exact_match_strict"] is not None
    # int8 keeps embeddings in full precision but stores every projection in a quarter of the bytes,
    # and changes the model's predictions very little.
    aligned, int8 = row(demo_dir, "aligned"), row(demo_dir, "aligned-int8")
    assert int8["size_bytes"] < 0.8 * aligned["size_bytes"]
    for domain, bpb in aligned["bpb"].items():
        assert int8["bpb"][domain] == pytest.approx(bpb, rel=0.02)
    report = (demo_dir / "report.md").read_text()
    for heading in ("## Time per stage", "## Time budget", "## The models", "## Curation",
                    "## Tokenizer and token shards", "## Model", "## Training", "## Fine-tuning and alignment",
                    "## Conversations before and after alignment", "## Samples", "## Arena", "### Tool use", "![loss](plots/loss.png)",
                    "![sft_loss](plots/sft_loss.png)", "![align](plots/align.png)"):
        assert heading in report, heading
    table = report.split("## The models")[1].split("\n\n")[1]
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == [f"**{n}**" for n in ROWS]


def test_a_second_run_reuses_finished_stages(demo_dir, capsys):
    assert main(["demo", "--out", str(demo_dir), "--budget-minutes", "0.05", *MICRO]) == 0
    err = capsys.readouterr().err
    assert err.count("reusing finished stage") == len(STAGES)
    # The lines it ends with are commands that parse: the served model is the quantized one.
    import argparse
    import shlex

    from groundup.serve.commands import serve_arguments

    serve = shlex.split(err.split("Serve it:")[1].splitlines()[0])
    assert serve[:2] == ["groundup", "serve"]
    parser = argparse.ArgumentParser()
    serve_arguments(parser)
    assert parser.parse_args(serve[2:]).model == str(demo_dir / "models" / "aligned-int8")


def test_the_demo_models_work_with_generate(demo_dir, capsys):
    for name in ("base", "aligned-int8"):
        assert main(["generate", "--checkpoint", str(demo_dir / "models" / name), "--prompt", "ROMEO.",
                     "--max-new-tokens", "4", "--temperature", "0"]) == 0
        assert "ROMEO." in capsys.readouterr().out


def test_a_spent_budget_still_runs_sft_and_aligns_the_sft_model(demo_dir):
    from safetensors.torch import load_file

    plans = json.loads((demo_dir / "budget.json").read_text())["plans"]
    assert plans["sft"]["short"] and plans["align"]["short"]  # nothing was left: each ran its few steps
    stages = json.loads((demo_dir / "stages.json").read_text())
    assert stages["sft"]["result"]["steps"] >= 1 and stages["align"]["result"]["steps"] >= 1
    base, sft = (load_file(demo_dir / "models" / n / "model.safetensors") for n in ("base", "sft"))
    assert any(not base[k].equal(sft[k]) for k in base)  # the model alignment starts from has had SFT
    assert f"base = {json.dumps(str(demo_dir / 'models' / 'sft'))}" in (demo_dir / "configs" / "grpo.toml").read_text()
    assert "skipped" not in row(demo_dir, "sft") and "skipped" not in row(demo_dir, "aligned")
    report = (demo_dir / "report.md").read_text()
    assert "ran its few steps anyway, past the budget" in report and "When pretraining was planned the load" in report


def test_a_budget_too_short_is_refused_before_pretraining(demo_dir, tmp_path, capsys):
    import shutil

    out = tmp_path / "demo"
    shutil.copytree(demo_dir, out, ignore=shutil.ignore_patterns("run", "sft", "align", "models"))
    code = main(["demo", "--out", str(out), "--budget-minutes", "0.05", *MICRO[:-1]])
    err = capsys.readouterr().err
    assert code == 2
    message = [line for line in err.splitlines() if line.startswith("error:")][0]
    assert "0.05-minute budget cannot hold the whole chain" in message and "--budget-minutes " in message
    assert not (out / "run").exists()  # pretraining never started


def test_the_arena_rates_every_model_from_battles_its_judge_always_decided(demo_dir):
    """The demo's own aligned model judges with its verdict alone: every order of every battle parses, and
    the four models get Bradley-Terry ratings with intervals."""
    ratings = json.loads((demo_dir / "arena" / "ratings.json").read_text())
    assert sorted(r["model"] for r in ratings["models"]) == ["aligned", "base", "sft", "untrained"]
    assert ratings["battles"] == 6 * 2 and ratings["rows"] == 2 * ratings["battles"]  # 6 pairs, both orders
    assert all(r["lower"] <= r["rating"] <= r["upper"] for r in ratings["models"])
    assert not (demo_dir / "arena" / "unparsable.jsonl").exists() or \
        not (demo_dir / "arena" / "unparsable.jsonl").read_text().strip()
    table = (demo_dir / "report.md").read_text().split("## Arena")[1]
    assert "| **" in table and "gave the same verdict in both orders" in table
