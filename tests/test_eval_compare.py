"""`groundup eval --compare A B`: McNemar's p-value by its definition, the paired bootstrap on cases whose
answer is known, and the command on two real evaluation folders (items paired by id, refused when they differ)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from groundup.cli import main
from groundup.errors import DataError
from groundup.eval.compare import (CompareSettings, compare_runs, load_run, mcnemar, paired_bootstrap,
                                   statistic)
from infer_helpers import model_dir, tiny_model

pytest.importorskip("scipy")


def exact_mcnemar(b: int, c: int) -> float:
    """statsmodels' `mcnemar(table, exact=True)`: twice the binomial(b + c, 1/2) tail below min(b, c), at most 1."""
    n = b + c
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


def test_mcnemar_exact_below_25_discordant_pairs_chi_square_above():
    for b, c in [(0, 0), (3, 0), (0, 7), (5, 9), (12, 12), (1, 23), (20, 4)]:
        p, test = mcnemar(b, c)
        assert test == "mcnemar exact" and p == pytest.approx(exact_mcnemar(b, c), rel=1e-12, abs=1e-15)
    assert mcnemar(8, 2)[0] == pytest.approx(0.109375, abs=1e-12)  # 2 * (1 + 10 + 45) / 1024, by hand
    # 45 discordant pairs: chi-square with continuity correction, (|30 - 15| - 1)^2 / 45 on one degree of freedom
    p, test = mcnemar(30, 15)
    x = (abs(30 - 15) - 1) ** 2 / 45
    assert test == "mcnemar chi2" and p == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-12)
    assert p == pytest.approx(0.036888, abs=1e-6)
    assert mcnemar(13, 12, exact_below=25)[1] == "mcnemar chi2" and mcnemar(13, 11)[1] == "mcnemar exact"


def test_paired_bootstrap_on_cases_with_known_answers():
    mean = statistic("acc")
    rng = np.random.default_rng(0)
    a = rng.normal(size=50)
    # every item 0.25 better in A: every resample says 0.25, so the interval is a point and nothing is as far
    # from 0.25 as 0.25 is from 0
    low, high, p = paired_bootstrap(a + 0.25, a, mean, resamples=2000, seed=1)
    assert low == pytest.approx(0.25) and high == pytest.approx(0.25) and p == pytest.approx(1 / 2001)
    low, high, p = paired_bootstrap(a, a, mean, resamples=2000, seed=1)  # the same numbers: no difference at all
    assert low == high == 0 and p == 1
    # 2,000 items with independent differences of mean 0.1 and sd 1: the 95% percentile interval is the normal
    # one, mean +- 1.96 sd / sqrt(n), to well within a tenth of its half width
    d = rng.normal(0.1, 1.0, size=2000)
    b = rng.normal(size=2000)
    low, high, p = paired_bootstrap(b + d, b, mean, resamples=10_000, seed=3)
    half = 1.959964 * d.std(ddof=1) / math.sqrt(len(d))
    assert low == pytest.approx(d.mean() - half, abs=0.1 * half) and high == pytest.approx(d.mean() + half, abs=0.1 * half)
    z = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert p == pytest.approx(math.erfc(abs(z) / math.sqrt(2)), abs=0.01)  # the two-sided normal p-value
    assert paired_bootstrap(b + d, b, mean, resamples=10_000, seed=3) == (low, high, p)  # seeded
    ppl = statistic("perplexity")
    assert ppl(np.array([-1.0, -3.0])) == pytest.approx(math.exp(2.0))


def write_run(path, task: str, metric_values: dict, records: list[dict], **fields) -> None:
    """A results folder as `groundup eval --out` writes one (results.json and items/<task>.jsonl)."""
    (path / "items").mkdir(parents=True)
    metrics = {m: {"value": v, "stderr": None} for m, v in metric_values.items()}
    task_fields = {"metrics": metrics, "data_hash": "d", "num_fewshot": 0, **fields}
    (path / "results.json").write_text(json.dumps({"model": {"path": str(path)}, "tasks": {task: task_fields}}))
    (path / "items" / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_verdicts_follow_the_tests_and_the_direction_of_better(tmp_path):
    right_a = [1] * 30 + [0] * 5 + [1] * 15
    right_b = [0] * 30 + [1] * 5 + [1] * 15
    write_run(tmp_path / "a", "t", {"acc": 0.9}, [{"id": f"t/{i}", "acc": x} for i, x in enumerate(right_a)])
    write_run(tmp_path / "b", "t", {"acc": 0.4}, [{"id": f"t/{i}", "acc": x} for i, x in reversed(list(enumerate(right_b)))])
    report = compare_runs(load_run(tmp_path / "a"), load_run(tmp_path / "b" / "results.json"))
    row, = report["rows"]
    assert row["a"] == pytest.approx(0.9) and row["b"] == pytest.approx(0.4) and row["diff"] == pytest.approx(0.5)
    assert row["discordant"] == {"a_only": 30, "b_only": 5} and row["test"] == "mcnemar chi2"
    assert row["p"] == pytest.approx(math.erfc(math.sqrt((25 - 1) ** 2 / 35 / 2)), rel=1e-12)
    assert row["verdict"] == "A better" and row["ci"][0] > 0 and row["n"] == 50
    assert compare_runs(load_run(tmp_path / "b"), load_run(tmp_path / "a"))["rows"][0]["verdict"] == "B better"
    # perplexity: lower is better, and it is not a 0/1 metric: the paired bootstrap decides
    lls_a, lls_b = [-2.0 - 0.01 * i for i in range(40)], [-2.5 - 0.01 * i for i in range(40)]
    write_run(tmp_path / "pa", "lambada_openai", {"perplexity": 1.0}, [{"id": i, "lls": [x]} for i, x in enumerate(lls_a)])
    write_run(tmp_path / "pb", "lambada_openai", {"perplexity": 1.0}, [{"id": i, "lls": [x]} for i, x in enumerate(lls_b)])
    row, = compare_runs(load_run(tmp_path / "pa"), load_run(tmp_path / "pb"))["rows"]
    assert row["a"] == pytest.approx(math.exp(-np.mean(lls_a))) and row["test"] == "paired bootstrap"
    assert row["diff"] < 0 and row["verdict"] == "A better" and row["p"] == pytest.approx(1 / 10_001)
    # items that failed in either run are left out and counted
    write_run(tmp_path / "fa", "t", {"acc": 0.5}, [{"id": 0, "acc": 1.0}, {"id": 1, "error": "too long"}, {"id": 2, "acc": 0.0}])
    write_run(tmp_path / "fb", "t", {"acc": 0.5}, [{"id": 0, "acc": 1.0}, {"id": 1, "acc": 1.0}, {"id": 2, "acc": 1.0}])
    row, = compare_runs(load_run(tmp_path / "fa"), load_run(tmp_path / "fb"))["rows"]
    assert row["n"] == 2 and row["excluded"] == 1 and row["verdict"] == "within noise" and row["p"] == 1.0


def test_different_items_are_refused_by_task(tmp_path):
    write_run(tmp_path / "a", "t", {"acc": 1.0}, [{"id": "t/0", "acc": 1.0}, {"id": "t/1", "acc": 1.0}])
    write_run(tmp_path / "b", "t", {"acc": 1.0}, [{"id": "t/0", "acc": 1.0}, {"id": "t/2", "acc": 1.0}])
    with pytest.raises(DataError, match=r"task t: A and B scored different items \(2 and 2; 1 only in A, first "
                                        r"'t/1', 1 only in B, first 't/2'\)"):
        compare_runs(load_run(tmp_path / "a"), load_run(tmp_path / "b"))
    write_run(tmp_path / "c", "t", {"acc": 1.0}, [{"id": "t/0", "acc": 1.0}, {"id": "t/1", "acc": 1.0}], num_fewshot=5)
    with pytest.raises(DataError, match=r"task t: A and B differ in few-shot count \(num_fewshot 0 and 5\)"):
        compare_runs(load_run(tmp_path / "a"), load_run(tmp_path / "c"))
    with pytest.raises(DataError, match="no results.json there"):
        load_run(tmp_path / "nowhere")
    with pytest.raises(Exception, match="resamples = 10: expected at least 100"):
        compare_runs(load_run(tmp_path / "a"), load_run(tmp_path / "a"), CompareSettings(resamples=10))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny models evaluated on the same 40 ARC-Easy items, and one on 20 of them."""
    root = tmp_path_factory.mktemp("compare")
    out = {}
    for name, seed, limit in (("a", 1, 40), ("b", 2, 40), ("short", 1, 20)):
        model = model_dir(root / f"model_{seed}", tiny_model(seed, init_std=0.2)) if name != "short" else root / "model_1"
        assert main(["eval", "--model", str(model), "--tasks", "arc_easy", "--limit", str(limit), "--out",
                     str(root / name), "--quiet", "--bootstrap-iters", "0"]) == 0
        out[name] = root / name
    return out


def test_compare_command_on_two_evaluations(runs, tmp_path, capsys):
    capsys.readouterr()
    assert main(["eval", "--compare", str(runs["a"]), str(runs["b"]), "--out", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert "task" in printed and "95% CI" in printed and "p-value" in printed and "verdict" in printed
    report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [(r["task"], r["metric"]) for r in report["rows"]] == [("arc_easy", m) for m in ("acc", "acc_norm", "acc_bytes")]
    items = {k: [json.loads(x) for x in (runs[k] / "items" / "arc_easy.jsonl").read_text().splitlines()] for k in "ab"}
    results = {k: json.loads((runs[k] / "results.json").read_text())["tasks"]["arc_easy"] for k in "ab"}
    for row in report["rows"]:
        m = row["metric"]
        a = {r["id"]: r[m] for r in items["a"]}
        b = {r["id"]: r[m] for r in items["b"]}
        wins = sum(a[i] == 1 and b[i] == 0 for i in a)
        losses = sum(a[i] == 0 and b[i] == 1 for i in a)
        assert row["discordant"] == {"a_only": wins, "b_only": losses} and row["n"] == 40
        assert row["p"] == pytest.approx(exact_mcnemar(wins, losses) if wins + losses < 25 else
                                         math.erfc(math.sqrt((abs(wins - losses) - 1) ** 2 / (wins + losses) / 2)))
        assert row["a"] == pytest.approx(results["a"]["metrics"][m]["value"])
        assert row["b"] == pytest.approx(results["b"]["metrics"][m]["value"])
        assert row["ci"][0] <= row["diff"] <= row["ci"][1]
        assert row["verdict"] == ("within noise" if row["p"] >= 0.05 else "A better" if row["diff"] > 0 else "B better")
        assert f"| arc_easy | {m} |" in (tmp_path / "cmp" / "compare.md").read_text()
    # a model against itself: no discordant item, p = 1
    assert main(["eval", "--compare", str(runs["a"]), str(runs["a"] / "results.json"), "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert all(r["diff"] == 0 and r["p"] == 1 and r["verdict"] == "within noise" for r in same["rows"])


def test_compare_refuses_other_items_and_stray_flags(runs, capsys):
    capsys.readouterr()
    assert main(["eval", "--compare", str(runs["a"]), str(runs["short"])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "task arc_easy: A and B scored different items (40 and 20; 20 only in A" in err
    assert main(["eval", "--compare", str(runs["a"]), str(runs["b"]), "--tasks", "piqa"]) == 2
    assert "--tasks does not go with it" in capsys.readouterr().err
