"""Evaluation others can reproduce: `groundup eval --export-lm-eval DIR` writes task files with which
lm-evaluation-harness itself, offline, scores the items `groundup eval` scores and gets its numbers; the
metrics lm-eval's definitions lack are documented (Winogrande's length-normalised ones dropped); generative
items carry their gold answer next to the output.

The decisive check runs lm-eval's own `simple_evaluate` with its `hf` model on the tiny model exported with
`groundup export hf`, over the exported files (no Hub: HF_DATASETS_OFFLINE / HF_HUB_OFFLINE), and compares
item by item with `groundup eval` on the same items.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from groundup.benchmarks import get_task  # noqa: E402
from groundup.cli import main  # noqa: E402
from groundup.eval.generation import Generated, run_generative  # noqa: E402
from groundup.eval.lm_eval_export import LM_EVAL_TASKS, lm_eval_tasks_dir  # noqa: E402
from groundup.sandbox.runner import default_python  # noqa: E402
from infer_helpers import model_dir, tiny_model  # noqa: E402

LIMIT = 8


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny model, its Hugging Face export, `groundup eval` on ARC-Easy and Winogrande (1-shot, so that the
    few-shot splits are exercised) and the lm-eval task files of both, written by the same command."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("export")
    model = model_dir(root / "model", tiny_model(5, init_std=0.2))
    assert main(["export", "hf", "--model", str(model), "--out", str(root / "hf")]) == 0
    assert main(["eval", "--model", str(model), "--tasks", "arc_easy,winogrande", "--limit", str(LIMIT),
                 "--num-fewshot", "1", "--out", str(root / "eval"), "--export-lm-eval", str(root / "lm"), "--quiet",
                 "--bootstrap-iters", "0"]) == 0
    return root


def records(root, task: str) -> list[dict]:
    return [json.loads(line) for line in (root / "eval" / "items" / f"{task}.jsonl").read_text().splitlines()]


def test_lm_eval_reproduces_groundup_on_the_exported_tasks(exported):
    import lm_eval
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    # include_defaults=False: lm-eval's own task index is not needed, the files include its YAMLs by path
    manager = TaskManager(include_path=str(exported / "lm"), include_defaults=False)
    out = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(exported / "hf"), "dtype": "float32"}, device="cpu",
        tasks=["groundup_arc_easy", "groundup_winogrande"], task_manager=manager, limit=LIMIT, batch_size=4,
        log_samples=True, bootstrap_iters=0)
    ours = json.loads((exported / "eval" / "results.json").read_text())["tasks"]
    assert set(ours["arc_easy"]["metrics"]) == {"acc", "acc_norm", "acc_bytes"}
    assert set(ours["winogrande"]["metrics"]) == {"acc"}  # partial scoring: no length to normalise by
    for task in ("arc_easy", "winogrande"):
        theirs = out["results"][f"groundup_{task}"]
        assert out["configs"][f"groundup_{task}"]["num_fewshot"] == 1
        assert {m: theirs[f"{m},none"] for m in ours[task]["metrics"]} == \
            {m: v["value"] for m, v in ours[task]["metrics"].items()}  # equal, not close: the same 0/1 per item
        samples = sorted(out["samples"][f"groundup_{task}"], key=lambda s: s["doc_id"])
        assert len(samples) == LIMIT
        for sample, rec in zip(samples, records(exported, task)):
            assert rec["id"] == f"{task}/{sample['doc_id']}"
            assert [r[0][0] for r in sample["resps"]] == pytest.approx(rec["lls"], abs=2e-3)
            assert {m: sample[m] for m in ours[task]["metrics"]} == {m: rec[m] for m in ours[task]["metrics"]}
    legend = (exported / "eval" / "results.md").read_text().split("## Metrics")[1]
    assert "- acc_bytes: acc with each choice's log-likelihood divided by its length in UTF-8 bytes" in legend
    assert "reproduces them): arc_easy: acc_bytes." in legend and legend.count("winogrande reports acc alone") == 1


def test_the_files_build_lm_evals_requests_and_say_what_they_hold(exported, tmp_path, capsys):
    """Every kind of task the export writes (its items' split as lm-eval's test split, few-shot from another
    split or the same one without the item, lm-eval's inline examples, lm-eval's process_docs, MMLU's
    first-n dev examples and its group) builds in lm-eval exactly groundup's requests."""
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    lm = tmp_path / "lm"
    capsys.readouterr()
    assert main(["eval", "--tasks", f"piqa,lambada,gsm8k,mmlu,{custom_task(tmp_path)}", "--export-lm-eval", str(lm),
                 "--num-fewshot", "2", "--limit", "5"]) == 0
    printed = capsys.readouterr().out
    assert "skipped capitals: a custom task: lm-eval has no definition of it to include" in printed
    assert f"--include_path {lm.resolve()} --tasks groundup_mmlu,groundup_piqa,groundup_lambada_openai," \
           "groundup_gsm8k_cot --limit 5" in printed
    manifest = json.loads((lm / "export.json").read_text())
    piqa = manifest["tasks"]["piqa"]
    assert piqa["splits"]["validation"]["docs"] == len(get_task("piqa").items()) == 1838
    assert piqa["num_fewshot"] == 2 and piqa["include"] == str(lm_eval_tasks_dir() / LM_EVAL_TASKS["piqa"][0])
    assert len(manifest["tasks"]) == 3 + 57 and manifest["group"] == "groundup_mmlu"
    manager = TaskManager(include_path=str(lm), include_defaults=False)
    assert "groundup_mmlu" in manager.all_groups
    names = ["piqa", "lambada_openai", "gsm8k_cot", "mmlu_anatomy"]
    loaded = manager.load([f"groundup_{n}" for n in names])["tasks"]
    for name in names:
        task = loaded[f"groundup_{name}"]
        task.set_fewshot_seed(1234)
        task.build_all_requests(limit=4)
        per_doc: dict[int, list] = {}
        for inst in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
            per_doc.setdefault(inst.doc_id, []).append(inst.arguments)
        items = get_task(name).items(limit=4, num_fewshot=2)
        if name == "gsm8k_cot":
            assert [(r[0][0], r[0][1]["until"]) for r in per_doc.values()] == [(i.prompt, i.stop) for i in items]
        else:
            assert [[tuple(a) for a in r] for r in per_doc.values()] == [i.requests() for i in items], name


def custom_task(path):
    (path / "items.jsonl").write_text(json.dumps({"country": "France", "options": ["Paris", "Rome"], "answer": 0}) + "\n")
    keys = {"name": "capitals", "data": "items.jsonl", "kind": "multiple_choice",
            "context": "Q: What is the capital of {country}?\\nA:", "choices": "options", "gold": "answer"}
    (path / "capitals.toml").write_text("".join(f'{k} = "{v}"\n' for k, v in keys.items()))
    return path / "capitals.toml"


def test_export_refusals_are_one_line(tmp_path, capsys):
    capsys.readouterr()
    for argv, message in (
        (["--export-lm-eval", tmp_path / "x"], "nothing to evaluate: pass --tasks"),
        (["--export-lm-eval", tmp_path / "x", "--bpb", tmp_path], "--export-lm-eval writes tasks: pass --tasks"),
        (["--tasks", "gsm8k", "--export-lm-eval", tmp_path / "x", "--samples", "4", "--k", "1"],
         "--samples 4 has no lm-eval counterpart"),
        (["--tasks", "piqa", "--export-lm-eval", tmp_path / "x", "--out", tmp_path / "y"], "--out is for an evaluation"),
        (["--tasks", custom_task(tmp_path), "--export-lm-eval", tmp_path / "x"], "none of the tasks has an lm-eval"),
        (["--tasks", "piqa"], "--model is required"),
    ):
        assert main(["eval", *map(str, argv)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, err
    assert not (tmp_path / "x").exists()


def test_generative_items_record_the_gold_answer_beside_the_output():
    task = get_task("gsm8k")
    items = task.items(limit=2)
    out = run_generative(task, items, lambda prompts, **_: [Generated(f"The answer is {i}.") for i in range(len(prompts))])
    assert [(r["id"], r["target"], r["outputs"]) for r in out["records"]] == \
        [(it.id, it.target, [f"The answer is {i}."]) for i, it in enumerate(items)]
    assert all(r["target"] and r["target"].isdigit() for r in out["records"])
    default_python()
    code = get_task("humaneval")
    item = code.items(limit=1)[0]
    rec = run_generative(code, [item], lambda prompts, **_: [Generated("    return None\n")])["records"][0]
    assert rec["target"] == item.tests and rec["target"].rstrip().endswith(f"check({item.entry_point})")
    assert rec["passed"] == [False]
