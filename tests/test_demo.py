"""A micro demo: every stage end to end on a slice of the embedded corpus, in about a minute.

The budget is tiny, so every training stage gets the floor of its time limit (a few steps); what
is checked is the chain: each stage's output, the report card, reuse on a rerun, the time limits
reaching the verbs, and the budget's arithmetic (separately, with a fake clock).
"""

from __future__ import annotations

import json

import pytest

from groundup.cli import main
from groundup.config import from_dict
from groundup.demo.budget import DEFAULT_OVERHEAD_S, FIXED_SECONDS, MIN_STAGE_SECONDS, ROW_MARGIN, DemoBudget
from groundup.demo.config import DemoConfig

MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128, "max_seq_len": 128}
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
         # A 40-chunk slice holds one or two works: holding out whole works would leave no text on one side.
         'tokenize.split_group=""', 'tokenizer.holdout_group=""',
         "skip_spent_stages=false"]  # the budget is spent at once: run every stage for its floor anyway
STAGES = ["sample", "chat", "curate", "tokenizer", "tokenize", "untrained", "score_untrained", "pretrain", "export_base", "score_base", "samples",
          "sft", "export_sft", "score_sft", "align", "export_aligned", "score_aligned", "quantize",
          "score_aligned-int8"]
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
                 "configs/sft.toml", "configs/grpo.toml"):
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
        assert summary["time_limit_s"] == plans[stage]["seconds"] >= MIN_STAGE_SECONDS
        assert summary["steps"] >= 1
    commands = (demo_dir / "commands.sh").read_text()
    assert "groundup sft" in commands and "groundup grpo" in commands and "--method int8" in commands


def test_the_report_card_has_a_row_per_model_with_every_measure(demo_dir):
    for name in ROWS:
        r = row(demo_dir, name)
        assert set(r["bpb"]) == {"text", "code", "math"} and all(v > 0 for v in r["bpb"].values())
        assert 0 <= r["end_turn"] <= 1 and 0 <= r["exact_match_strict"] <= r["exact_match_lenient"] <= 1
        assert r["math_problems"] == 8 and r["mc_items"] == 8 and set(r["mc_tasks"]) == {"arc_easy"}
        assert -3 <= r["mc_centered"] <= 1 and r["decode_tokens_per_s"] > 0
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
                    "## Conversations before and after alignment", "## Samples", "![loss](plots/loss.png)",
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


class FakeRunner:
    def __init__(self, times):
        self._times = times

    def times(self):
        return self._times


def test_the_budget_split_in_closed_form():
    cfg = from_dict(DemoConfig, {"budget_minutes": 10})  # 600 s; shares 0.7 / 0.15 / 0.15
    times = {"sample": 10.0, "curate": 22.0, "score_untrained": 8.0}
    budget = DemoBudget(cfg, FakeRunner(times))
    fixed = FIXED_SECONDS["report"] + FIXED_SECONDS["quantize"]
    # Before pretraining: four rows at the untrained row's 8 s, three training stages' default overhead.
    reserve = 4 * 8 * ROW_MARGIN + fixed + 3 * DEFAULT_OVERHEAD_S
    plan = budget.plan("pretrain", row_seconds=8.0)
    assert plan.left == 560 and plan.reserved == pytest.approx(reserve, abs=0.1)
    assert plan.seconds == pytest.approx((560 - reserve) * 0.7, abs=0.1)
    # Pretraining took 12 s more than its limit, the base row 10 s: SFT and alignment are planned with both.
    times.update({"pretrain": plan.seconds + 12.0, "score_base": 10.0})
    plan = budget.plan("sft", row_seconds=10.0, rows_done=1)
    reserve = 3 * 10 * ROW_MARGIN + fixed + 2 * 12.0
    left = 600 - sum(times.values())
    assert plan.left == pytest.approx(left, abs=0.1) and plan.reserved == pytest.approx(reserve, abs=0.1)
    assert plan.seconds == pytest.approx((left - reserve) * 0.5, abs=0.1)
    # A spent budget still gives a stage its floor, never a negative limit.
    budget = DemoBudget(cfg, FakeRunner({"pretrain": 700.0}))
    spent = budget.plan("align", row_seconds=10.0, rows_done=3)
    assert spent.seconds == MIN_STAGE_SECONDS and spent.spent and not plan.spent
    # until=pretrain: pretraining gets all the training time, and one row is reserved.
    short = from_dict(DemoConfig, {"budget_minutes": 10, "until": "pretrain"})
    plan = DemoBudget(short, FakeRunner(times := {"sample": 10.0, "curate": 30.0})).plan("pretrain", row_seconds=8.0)
    assert plan.seconds == pytest.approx(560 - 8 * ROW_MARGIN - FIXED_SECONDS["report"] - DEFAULT_OVERHEAD_S, abs=0.1)


def test_a_spent_budget_skips_sft_and_alignment_instead_of_overrunning(demo_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file

    out = tmp_path / "demo"
    shutil.copytree(demo_dir, out)  # the data stages, pretraining and its rows are reused
    assert main(["demo", "--out", str(out), "--budget-minutes", "0.05", *MICRO, "skip_spent_stages=true"]) == 0
    for name, previous in (("sft", "base"), ("aligned", "sft")):
        assert row(out, name)["skipped"].startswith("skipped: ")
        mine, theirs = (load_file(out / "models" / n / "model.safetensors") for n in (name, previous))
        assert all(mine[k].equal(theirs[k]) for k in theirs)
    stages = json.loads((out / "stages.json").read_text())
    assert stages["sft"]["seconds"] < 1 and stages["score_sft"]["seconds"] < 1
    report = (out / "report.md").read_text()
    assert "**sft** (skipped: the previous model)" in report and "**aligned-int8**" in report
