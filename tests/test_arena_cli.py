"""`groundup arena`: rating a battle log (JSONL or Parquet) end to end, the flags' errors, and running battles
between two tiny models with a scripted judge behind a fake OpenAI endpoint, then rating them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from groundup.arena.commands import split_models
from groundup.cli import main
from groundup.errors import ConfigError
from groundup.layout import made_by

TRUE = {"ace": 1100.0, "bee": 1000.0, "cat": 900.0}


def battle_rows(n: int = 240, seed: int = 0) -> list[dict]:
    """Battles judged in both orders (swap false/true, one battle_id), with answers of varied length."""
    rng = np.random.default_rng(seed)
    names = list(TRUE)
    rows = []
    for k in range(n):
        i, j = rng.choice(3, 2, replace=False)
        a, b = names[i], names[j]
        p = 1 / (1 + 10 ** ((TRUE[b] - TRUE[a]) / 400))
        for swap in (False, True):
            winner = "tie" if rng.random() < 0.1 else ("model_a" if rng.random() < p else "model_b")
            rows.append({"battle_id": f"{a}-vs-{b}-{k}", "question_id": f"q{k % 40}", "category": "math",
                         "model_a": a, "model_b": b, "winner": winner, "judge": "j1", "swap": swap, "prompt": "p",
                         "answer_a": "x" * int(rng.integers(20, 400)), "answer_b": "y" * int(rng.integers(20, 400)),
                         "verdict_raw": "[[A]]", "attempts": 1, "tstamp": float(k)})
    return rows


BAD_LINES = ["{not json", json.dumps({"model_a": "ace", "model_b": "ace", "winner": "tie"}),
             json.dumps({"model_a": "ace", "model_b": "bee", "winner": "draw"}),
             json.dumps({"model_a": "ace", "model_b": "bee", "winner": "tie", "swap": "yes"})]


@pytest.fixture
def log(tmp_path) -> Path:
    path = tmp_path / "battles.jsonl"
    path.write_text("\n".join([json.dumps(r) for r in battle_rows()] + BAD_LINES) + "\n")
    return path


def test_rating_a_log_writes_ratings_report_and_plots(tmp_path, log, capsys):
    out = tmp_path / "arena"
    assert main(["arena", "--battles", str(log), "--out", str(out), "--baseline", "bee", "--bootstrap", "30",
                 "--quiet"]) == 0
    got = json.loads((out / "ratings.json").read_text())
    n = len(battle_rows())
    assert (got["rows"], got["battles"], got["rows_skipped"]) == (n, n // 2, 4)  # two orders -> one battle
    assert got["skipped_reasons"] == {"bad json": 1, "same model": 1, "bad winner": 1, "bad swap": 1}
    assert got["skipped_examples"] == [
        f"{log}:{n + 2}: model_a and model_b are the same model ('ace')",
        f"{log}:{n + 3}: 'winner' is 'draw', expected one of model_a, model_b, tie, tie (bothbad)",
        f"{log}:{n + 4}: 'swap' is 'yes', expected true or false",
        f"{log}:{n + 1}: invalid JSON: Expecting property name enclosed in double quotes (column 2)"]
    models = got["models"]
    assert [m["model"] for m in models] == ["ace", "bee", "cat"]
    for m in models:
        assert set(m) >= {"rating", "lower", "upper", "median", "rank", "rank_range", "battles", "online_elo"}
        assert m["lower"] <= m["median"] <= m["upper"] and m["rank"] == m["rank_range"][0]
    assert sum(m["battles"] for m in models) == 2 * got["battles"]
    assert np.mean([m["rating"] for m in models]) == pytest.approx(1000.0, abs=1e-3)
    assert got["judge_agreement"]["j1"]["pairs"] == n // 2
    assert set(got["length_controlled"]) == {"ace", "cat"}
    assert got["length_controlled"]["ace"]["win_rate"] > 50 > got["length_controlled"]["cat"]["win_rate"]
    report = (out / "report.md").read_text()
    for heading in ("## Ratings", "## Win rate", "## Battles per pair", "## Judge agreement across the swap",
                    "## Win rate against bee", "![ratings.png](ratings.png)"):
        assert heading in report
    assert (out / "ratings.png").stat().st_size > 1000 and (out / "win_rate.png").stat().st_size > 1000
    assert made_by(out) == "arena"
    printed = capsys.readouterr().out
    assert f"{out / 'ratings.json'}" in printed and "3 models from 240 battles (4 rows skipped)" in printed

    # The same log as Parquet rates the same; --each-order rates both orders as battles.
    table = tmp_path / "battles.parquet"
    pq.write_table(pa.Table.from_pylist(battle_rows()), table)
    again = tmp_path / "again"
    assert main(["arena", "--battles", str(table), "--out", str(again), "--bootstrap", "30", "--style-control",
                 "--quiet"]) == 0
    parquet = json.loads((again / "ratings.json").read_text())
    assert [(m["model"], m["rating"], m["lower"]) for m in parquet["models"]] == \
        [(m["model"], m["rating"], m["lower"]) for m in models]
    assert got["style_control"] is None
    style = parquet["style_control"]
    assert (style["battles"], style["left_out"]) == (n // 2, 0) and set(style["coefficients"]) == \
        {"length", "headers", "lists", "bold"}
    assert [m["model"] for m in style["models"]] == ["ace", "bee", "cat"]  # answer style here is noise
    assert "## Style control" in (again / "report.md").read_text()
    assert main(["arena", "--battles", str(table), "--out", str(again), "--each-order", "--bootstrap", "0",
                 "--anchor", "cat", "--anchor-rating", "800", "--quiet"]) == 0
    each = json.loads((again / "ratings.json").read_text())
    assert each["battles"] == n and {m["model"]: m["rating"] for m in each["models"]}["cat"] == pytest.approx(800.0)


@pytest.mark.parametrize("argv,message", [
    ([], "give --battles FILE (rate a log) or --models NAME=SOURCE ... (run battles), not both"),
    (["--models", "a=x", "b=y"], "give --battles FILE"),  # both
    (["--prompts", "p.jsonl"], "--prompts goes with --models (running battles), not --battles"),
    (["battles_per_pair=3"], "battles_per_pair=3: battle settings apply only when --models runs battles"),
    (["--baseline", "dog"], "baseline = 'dog': expected a model of the log (ace, bee, cat)"),
    (["--anchor", "dog"], "anchor = 'dog': expected a model of the log (ace, bee, cat), or '' for no anchor"),
    (["--bootstrap", "-1"], "bootstrap"),
])
def test_flag_errors_name_the_problem(tmp_path, log, capsys, argv, message):
    base = ["arena", "--out", str(tmp_path / "o"), "--quiet"] + (["--battles", str(log)] if argv else [])
    assert main(base + argv) == 2
    assert message in capsys.readouterr().err


def test_a_log_without_a_usable_row_is_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"model_a": "x", "model_b": "y", "winner": "??"}) + "\n")
    assert main(["arena", "--battles", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert f"no usable battle in {bad}: 1 rows skipped ({bad}:1: 'winner' is '??'" in capsys.readouterr().err
    assert main(["arena", "--battles", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_models_and_overrides_are_told_apart():
    keys = {"battles_per_pair", "seed", "sampler"}
    assert split_models(["a=out/a", "b=http://h:8000/v1#m=x", "seed=3", "battles_per_pair=4"], keys) == (
        {"a": "out/a", "b": "http://h:8000/v1#m=x"}, ["seed=3", "battles_per_pair=4"])
    for bad in (["a"], ["a=x", "a=y"], ["=x"]):
        with pytest.raises(ConfigError):
            split_models(bad, keys)


def test_models_run_battles_then_ratings(tmp_path, monkeypatch, capsys):
    """Two tiny checkpoints, a judge behind a fake OpenAI endpoint: battles, then ratings of the log they left;
    a rerun judges nothing again and rates the same log."""
    pytest.importorskip("openai")
    from infer_helpers import model_dir, tiny_model
    from judge_helpers import FakeOpenAI, judged_user_text

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    alice = model_dir(tmp_path / "alice", tiny_model(seed=1))
    bob = model_dir(tmp_path / "bob", tiny_model(seed=2))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "category": "math", "prompt": f"What is {i}+{i}?"})
                               + "\n" for i in range(4)))

    def verdict(body: dict) -> str:
        return "[[" + "ABC"[hashlib.sha256(judged_user_text(body).encode()).digest()[0] % 3] + "]]"

    out = tmp_path / "arena"
    argv = ["arena", "--models", f"alice={alice}", f"bob={bob}", "battles_per_pair=3", "max_tokens=4",
            "--prompts", str(prompts), "--out", str(out), "--bootstrap", "10", "--quiet"]
    with FakeOpenAI(verdict) as judge:
        assert main([*argv, "--judge", judge.url + "#judge"]) == 0
        calls = len(judge.chats())
        assert calls == 6  # 3 battles x 2 orders
        first = json.loads((out / "ratings.json").read_text())
        assert main([*argv, "--judge", judge.url + "#judge"]) == 0
        assert len(judge.chats()) == calls
    assert first["battle_logs"] == [str(out / "battles.jsonl")] and first["rows"] == 6 and first["battles"] == 3
    assert {m["model"] for m in first["models"]} == {"alice", "bob"}
    assert first["judge_agreement"][judge.url + "#judge"]["pairs"] == 3
    assert json.loads((out / "ratings.json").read_text())["models"] == first["models"]
    assert made_by(out) == "arena"
