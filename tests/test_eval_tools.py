"""Generative evaluation with tools: a custom task whose `tools` key (or `eval --tools`) sends each prompt through the
tool loop; the final answer is scored, and results.json records the tools, the share of replies that called one
and the share of calls that ran without error. A tiny model made to write the calls (tool_script.Script)."""

from __future__ import annotations

import json

import pytest

from groundup.benchmarks.custom import load_custom_task
from groundup.cli import main
from groundup.errors import ConfigError
from groundup.eval.harness import EvalSettings, evaluate
from infer_helpers import model_dir, small_tokenizer, tiny_model
from tool_script import Script, one_thread  # noqa: F401 - autouse

ITEMS = [{"q": "What is 7 * 8?", "a": "56"}, {"q": "What is 2 ** 10?", "a": "1024"},
         {"q": "What is 1 / 0?", "a": "undefined"}]


def call(expression: str) -> str:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


# item 1: a call that works, then the answer; item 2: the answer, no call; item 3: a call that fails, then the answer
REPLIES = [call("7 * 8"), "56", "1024", call("1 / 0"), "undefined"]


def _task(folder, tools: str | None = '"calculator"', kind: str = "generate"):
    (folder / "items.jsonl").write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    keys = 'target = "a"' if kind == "generate" else 'choices = ["{a}", "no"]\ngold = "a"'
    lines = ['name = "arith"', 'data = "items.jsonl"', f'kind = "{kind}"', 'context = "{q}"', keys]
    if tools is not None:
        lines.append(f"tools = {tools}")
    path = folder / "arith.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_final_answer_is_scored_and_results_json_has_the_shares(tmp_path, monkeypatch):
    import groundup.loading

    model = tiny_model(max_seq_len=2048)  # the tools' definitions fill a few hundred tokens
    path = model_dir(tmp_path / "m", model)
    load = groundup.loading.load_for_inference

    def scripted(*args, **kwargs):
        m, tok = load(*args, **kwargs)
        Script(m, tok, REPLIES)
        return m, tok

    monkeypatch.setattr(groundup.loading, "load_for_inference", scripted)
    argv = ["eval", "--model", str(path), "--tasks", str(_task(tmp_path)), "--gen-batch-size", "1",
            "--max-gen-tokens", "200", "--max-tool-calls", "2", "--out", str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    task = results["tasks"]["arith"]
    assert task["metrics"]["exact_match"]["value"] == 1.0  # the answers after the calls, not the calls
    assert task["tools"] == {"tools": ["calculator"], "max_tool_calls": 2, "replies": 3,
                             "replies_with_call": pytest.approx(2 / 3), "calls": 2, "failed_calls": 1,
                             "calls_ok": 0.5}
    assert results["settings"]["max_tool_calls"] == 2
    items = [json.loads(line) for line in (tmp_path / "out" / "items" / "arith.jsonl").read_text().splitlines()]
    assert [(r["tool_calls"], r["tool_errors"]) for r in items] == [([1], [0]), ([0], [0]), ([1], [1])]


def test_eval_tools_runs_a_task_that_has_none_and_without_tools_nothing_is_recorded(tmp_path):
    tok, model = small_tokenizer(), tiny_model(max_seq_len=2048)
    task = load_custom_task(_task(tmp_path, tools=None))
    Script(model, tok, REPLIES)
    out = evaluate(model, tok, [task], EvalSettings(tools="calculator", gen_batch_size=1, max_gen_tokens=200),
                   progress=False)
    result = out["tasks"]["arith"]
    assert result["tools"]["calls"] == 2 and result["metrics"]["exact_match"]["value"] == 1
    Script(model, tok, ["56", "1024", "x"])
    out = evaluate(model, tok, [task], EvalSettings(gen_batch_size=1, max_gen_tokens=20), progress=False)
    assert "tools" not in out["tasks"]["arith"] and "tool_calls" not in out["records"]["arith"][0]


def test_tools_that_cannot_work_fail_before_the_model_loads(tmp_path, capsys):
    with pytest.raises(ConfigError, match="only a generate task's model calls tools") as e:
        load_custom_task(_task(tmp_path, kind="multiple_choice"))
    assert e.value.key == "tools"
    argv = ["eval", "--model", str(tmp_path / "no_model_here"), "--tasks", str(_task(tmp_path, '"nosuch"'))]
    assert main(argv) == 2
    assert "nosuch" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="max_tool_calls = 0"):
        EvalSettings(max_tool_calls=0).validate()
