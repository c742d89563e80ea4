"""Tool-use chats from the corpus (`data sample --chat --tools`): every tool result is the true one (the calculator's
equals Python's exact arithmetic, python's is what the sandbox prints when the program runs again), code tasks
retry after real failures and end with a function that passes its tests, the held-out functions are new ones,
and everything is seeded."""

from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from fractions import Fraction

import pytest

from groundup.cli import main
from groundup.corpus.chat import math_chats
from groundup.corpus.code_tasks import KINDS
from groundup.corpus.tool_chats import PASSED_LINE, TOOLS, tool_code_chats, tool_math_chats, tool_output
from groundup.rewards.functions import code as code_reward
from groundup.rewards.functions import exact_match
from groundup.sandbox import default_python, run_many

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def exact(text: str) -> Fraction:
    """The arithmetic expression's exact value, read independently of the module's own trees."""
    def value(node):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        assert isinstance(node, ast.Constant) and isinstance(node.value, int), ast.dump(node)
        return Fraction(node.value)
    return value(ast.parse(text, mode="eval").body)


def calls_and_results(record):
    """[(tool name, arguments, result text)] in order, checking every call is answered right after it."""
    out, messages = [], record["messages"]
    for i, m in enumerate(messages):
        for k, c in enumerate(m.get("tool_calls") or []):
            answer = messages[i + 1 + k]
            assert answer["role"] == "tool" and answer["tool_call_id"] == c["id"] and c["type"] == "function"
            out.append((c["function"]["name"], json.loads(c["function"]["arguments"]), answer["content"]))
    return out


@pytest.fixture(scope="module")
def math_records():
    return list(tool_math_chats(400, seed=0, max_operand=0))


@pytest.fixture(scope="module")
def code_records():
    return list(tool_code_chats(80, seed=0))


def test_calculator_results_equal_exact_arithmetic_and_the_reply_scores(math_records):
    styles = Counter()
    for r in math_records:
        uses = calls_and_results(r)
        styles[(uses[0][0], len(uses))] += 1
        for name, args, text in uses:
            if name == "calculator":
                assert Fraction(text) == exact(args["expression"]) and text == str(int(text))
        final = r["messages"][-1]
        assert final["role"] == "assistant" and final["content"].endswith(f"\nAnswer: {r['answer']}")
        assert exact_match("", final["content"], answer=r["answer"]) == 1.0
        assert exact(uses[-1][1].get("expression") or uses[-1][1]["code"][6:-1]) == int(r["answer"])
        assert r["tools"] == TOOLS
    calculator = sum(v for (name, _), v in styles.items() if name == "calculator")
    assert calculator > 0.6 * len(math_records) and styles[("python", 1)] > 0.08 * len(math_records)
    assert sum(v for (name, n), v in styles.items() if n > 1) > 0.05 * len(math_records)  # one call per step


def test_math_questions_and_split_are_the_plain_chats(math_records):
    """Tool and plain SFT are measured on the same held-out questions."""
    plain = list(math_chats(400, seed=0))
    assert [r["messages"][-2]["content"] for r in plain] == [
        next(m["content"] for m in r["messages"] if m["role"] == "user") for r in math_records]
    assert [r["split"] for r in plain] == [r["split"] for r in math_records]
    assert [r["answer"] for r in plain] == [r["answer"] for r in math_records]
    assert 0 < sum(r["split"] == "heldout" for r in math_records) < 60


def test_python_results_are_what_the_sandbox_prints(math_records, code_records):
    runs = [(args["code"], text) for r in math_records[:80] for name, args, text in calls_and_results(r)
            if name == "python"]
    runs += [(args["code"], text) for r in code_records[::6] for _, args, text in calls_and_results(r)]
    assert len(runs) > 25 and any("Traceback" in text for _, text in runs)
    results = run_many([c for c, _ in runs], python=default_python(), timeout=30.0)
    assert [tool_output(res) for res in results] == [text for _, text in runs]
    assert any(text.endswith(".0\n") for _, text in runs)  # `/` in python prints a float


def test_code_tasks_retry_after_real_failures_and_end_passing(code_records):
    attempts = Counter(r["attempts"] for r in code_records)
    assert 0.35 < attempts[1] / len(code_records) < 0.65 and attempts[2] > 0 and attempts[3] > 0
    assert set(attempts) == {1, 2, 3}
    for r in code_records:
        uses = calls_and_results(r)
        assert len(uses) == r["attempts"] and all(name == "python" for name, _, _ in uses)
        assert uses[-1][2] == PASSED_LINE + "\n"
        for _, _, text in uses[:-1]:  # every earlier attempt failed, with a real traceback
            assert text.startswith("Traceback (most recent call last):\n") and "groundup-sandbox" not in text
        for m in r["messages"][3:-1:2]:  # each retry says which test failed (or what raised)
            assert m["role"] == "assistant"
            assert re.match(r"(The test `assert .*` failed\.|`.*` raised \w+)", m["content"]), m["content"]
        final = r["messages"][-1]["content"]
        source = final.split("```python\n")[1].split("```")[0]
        assert uses[-1][1]["code"].startswith(source)  # the answer is the code that passed
        assert r["tests"].startswith("def check(candidate):\n") and 3 <= r["tests"].count("assert") <= 5
    assert {r["kind"] for r in code_records} == set(KINDS)


def test_the_final_functions_pass_the_code_reward(code_records):
    for r in code_records[:12]:
        source = r["messages"][-1]["content"].split("```python\n")[1].split("```")[0]
        assert code_reward("", source, tests=r["tests"], entry_point=r["entry_point"]) == 1.0
        first = calls_and_results(r)[0][1]["code"].split("\n\n\n")[0]
        assert code_reward("", first, tests=r["tests"], entry_point=r["entry_point"]) == float(r["attempts"] == 1)


def test_held_out_code_tasks_are_new_functions_and_the_split_is_stable(code_records):
    def function(r):
        return r["messages"][0]["content"].split(" It must pass")[0]

    held = {function(r) for r in code_records if r["split"] == "heldout"}
    trained = {function(r) for r in code_records if r["split"] == "train"}
    assert held and not held & trained
    kinds = Counter(r["kind"] for r in code_records if r["split"] == "heldout")
    assert set(kinds) <= {r["kind"] for r in code_records if r["split"] == "train"}  # new functions of trained kinds
    again = list(tool_code_chats(30, seed=0, chunk=7))  # another chunking: the same records
    assert again == code_records[:30]


def test_sft_reads_every_record_with_its_tools(math_records, code_records, tmp_path):
    from groundup.data.readers import ReadStats
    from groundup.posttrain.records import iter_examples

    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in math_records[:50] + code_records[:20]))
    bad: list[str] = []
    examples = list(iter_examples([path], ReadStats(), bad))
    assert bad == [] and len(examples) == 70 and all(e.tools == TOOLS for e in examples)


def test_seeded(math_records):
    assert list(tool_math_chats(400, seed=0)) == math_records
    other = list(tool_math_chats(50, seed=1))
    assert [r["messages"] for r in other] != [r["messages"] for r in math_records[:50]]


def test_data_sample_writes_the_tool_files(tmp_path, capsys):
    out = tmp_path / "tools"
    assert main(["data", "sample", "--chat", "--tools", "--domains", "math", "code", "--math-count", "60", "--limit",
                 "8", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.glob("*.jsonl"))
    assert names == ["chat-tools-code.heldout.jsonl", "chat-tools-code.jsonl", "chat-tools-math.heldout.jsonl",
                     "chat-tools-math.jsonl"] or names == ["chat-tools-code.jsonl", "chat-tools-math.heldout.jsonl",
                                                            "chat-tools-math.jsonl"]
    code = [json.loads(line) for name in names if "code" in name for line in (out / name).read_text().splitlines()]
    assert len(code) == 8 and all(r["tools"] == TOOLS for r in code)
    assert main(["data", "sample", "--tools", "--out", str(tmp_path / "x")]) == 2
    assert "--tools goes with --chat" in capsys.readouterr().err
