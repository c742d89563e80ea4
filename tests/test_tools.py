"""The tools a model calls (groundup/tools): the calculator is Python's arithmetic and nothing more, `python`
runs in the sandbox, a user function's schema is read from its signature and docstring, and the runner
turns every failure (a raise, a timeout, a huge result, a bad call) into an error result, never an exception."""

from __future__ import annotations

import json
import math
import random
import sys
import textwrap
import time

import pytest

from groundup.errors import ConfigError
from groundup.tokenizer.tool_calls import ToolCall
from groundup.tools import Tool, ToolRunner, calculate, resolve_tools, user_tool
from groundup.tools.calculator import CalculatorError

# ----------------------------------------------------------------------------- the calculator


def _expression(rng: random.Random, depth: int = 0) -> str:
    """A random arithmetic expression of the kind the calculator takes (Python syntax)."""
    if depth > 3 or rng.random() < 0.3:
        if rng.random() < 0.7:
            return str(rng.randint(0, 999))
        return repr(round(rng.uniform(0, 100), rng.randint(0, 3)))
    kind = rng.random()
    if kind < 0.6:
        op = rng.choice(["+", "-", "*", "/", "//", "%"])
        return f"{_expression(rng, depth + 1)} {op} {_expression(rng, depth + 1)}"
    if kind < 0.7:
        return f"({_expression(rng, depth + 1)}) ** {rng.randint(-3, 6)}"
    if kind < 0.8:
        return f"-({_expression(rng, depth + 1)})"
    if kind < 0.9:
        return f"({_expression(rng, depth + 1)})"
    fn = rng.choice(["abs", "round", "min", "max", "sqrt"])
    if fn in ("min", "max"):
        return f"{fn}({_expression(rng, depth + 1)}, {_expression(rng, depth + 1)})"
    return f"{fn}(abs({_expression(rng, depth + 1)}))" if fn == "sqrt" else f"{fn}({_expression(rng, depth + 1)})"


def _python(expression: str) -> str:
    """Python's own answer (eval of our own generated text, in a namespace of the five functions)."""
    value = eval(expression, {"__builtins__": {}}, {"sqrt": math.sqrt, "abs": abs, "round": round, "min": min,
                                                      "max": max})
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:  # shown as a calculator shows it
        return str(int(value))
    return str(value)


def test_the_calculator_is_pythons_arithmetic_on_generated_expressions():
    rng = random.Random(0)
    compared = raised = 0
    for _ in range(3000):
        expression = _expression(rng)
        try:
            expected = _python(expression)
        except (ZeroDivisionError, OverflowError, ValueError) as e:
            with pytest.raises(type(e)):
                calculate(expression)
            raised += 1
            continue
        if "j" in expected:  # a negative number to a fractional power is complex in Python: refused here
            with pytest.raises(CalculatorError, match="not a real number"):
                calculate(expression)
            continue
        assert calculate(expression) == expected, expression
        compared += 1
    assert compared > 2000 and raised > 20  # both sides were exercised, division by zero included


@pytest.mark.parametrize("expression, reason", [
    ("().__class__.__base__", "attribute access is not arithmetic"),
    ("(1, 2)", "Tuple is not arithmetic"),
    ("(1).__class__", "attribute access is not arithmetic"),
    ("x + 1", "unknown name 'x'"),
    ("__import__('os')", "unknown function '__import__'"),
    ("__import__('os').system('true')", "attribute access is not arithmetic"),
    ("sqrt.__globals__", "attribute access is not arithmetic"),
    ("open('/etc/passwd')", "unknown function 'open'"),
    ("'a' * 3", "not a real number (str)"),
    ("True + 1", "not a real number (bool)"),
    ("1j * 2", "not a real number (complex)"),
    ("[1, 2][0]", "Subscript is not arithmetic"),
    ("1 < 2", "Compare is not arithmetic"),
    ("lambda: 1", "Lambda is not arithmetic"),
    ("round(2.5, ndigits=1)", "positional arguments only"),
    ("9 ** 9 ** 9", "too large (more than 4000 bits)"),
    ("2 ** 5000", "2**5000 is too large"),
    ("(2 ** 3000) * (2 ** 3000)", "too large (more than 4000 bits)"),
    ("1 +", "not an expression"),
    ("1" * 1001, "longer than 1000 characters"),
    ("-" * 200 + "1", "nested more than 64 deep"),
])
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression, reason):
    start = time.monotonic()
    with pytest.raises(CalculatorError) as e:
        calculate(expression)
    assert reason in str(e.value)
    assert time.monotonic() - start < 0.5  # refused before any work: 9**9**9 is never computed


def test_the_calculator_goes_up_to_its_bound_exactly_as_python():
    assert calculate("2 ** 3999") == str(2 ** 3999)
    assert calculate("-2 ** 2") == "-4" and calculate("(-2) ** 2") == "4"
    assert calculate("7 // -2") == "-4" and calculate("7 % -2") == "-1" and calculate("2 ** -1") == "0.5"
    assert calculate("sqrt(2)") == str(math.sqrt(2)) and calculate("round(2.675, 2)") == str(round(2.675, 2))


# ----------------------------------------------------------------------------- the runner


def _tool(name: str, fn, **properties) -> Tool:
    return Tool(name, f"the {name} tool", {"type": "object", "properties": properties,
                                            "required": list(properties)}, fn)


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(name, json.dumps(arguments))


def _raises(text: str):
    raise ValueError(f"cannot handle {text}")


def _exits():
    sys.exit(3)


def _sleeps():
    time.sleep(5)
    return "late"


def test_a_tool_that_raises_or_exits_is_an_error_result_the_model_reads():
    runner = ToolRunner([_tool("parse", _raises, text={"type": "string"}), _tool("quit", _exits)])
    result = runner.run(_call("parse", text="abc"))
    assert (result.ok, result.content, result.error) == (False, "Error: ValueError: cannot handle abc",
                                                         "ValueError: cannot handle abc")
    result = runner.run(_call("quit"))
    assert not result.ok and result.content == "Error: quit raised SystemExit: 3"


def test_a_tool_that_times_out_is_an_error_result_and_generation_does_not_wait():
    runner = ToolRunner([_tool("slow", _sleeps)], timeout_s=0.2)
    start = time.monotonic()
    result = runner.run(_call("slow"))
    assert time.monotonic() - start < 1.0
    assert not result.ok and result.content == "Error: slow did not finish within 0.2 s (timed out)"
    assert 0.2 <= result.seconds < 1.0


def test_a_huge_result_is_cut_to_max_result_chars_and_says_so():
    runner = ToolRunner([_tool("big", lambda: "x" * 1_000_000)], max_result_chars=2000)
    result = runner.run(_call("big"))
    assert len(result.content) == 2000 and result.content.startswith("x" * 1900)
    assert result.content.endswith("[truncated: the result was 1000000 characters, the first 1927 are shown]")
    assert result.content.count("x") == 1927 and not result.ok
    assert result.error == "the result was cut to 2000 characters"
    exploded = ToolRunner([_tool("err", lambda: _raises("y" * 10_000))], max_result_chars=300).run(_call("err"))
    assert len(exploded.content) == 300 and "[truncated" in exploded.content  # an error message is cut too


def test_bad_calls_are_error_results_naming_what_is_wrong():
    runner = ToolRunner(resolve_tools("calculator"))
    cases = [
        (ToolCall("calculater", "{}"),
            "Error: there is no tool 'calculater' (did you mean 'calculator'?); the tools are: calculator"),
        (ToolCall("calculator", "{not json"),
            "Error: the arguments are not valid JSON (Expecting property name enclosed in double quotes at "
            "character 1): '{not json'"),
        (ToolCall("calculator", "[1]"), "Error: the arguments must be a JSON object, not list"),
        (ToolCall("calculator", '{"expresion": "1"}'),
            "Error: calculator has no argument 'expresion' (did you mean 'expression'?); it takes: expression"),
        (ToolCall("calculator", "{}"), "Error: calculator needs the argument 'expression'; it takes: expression"),
        (ToolCall("calculator", '{"expression": 12}'),
            "Error: argument 'expression' of calculator must be of JSON type string, got 12"),
        (ToolCall("calculator", '{"expression": "1/0"}'), "Error: ZeroDivisionError: division by zero"),
    ]
    for call, expected in cases:
        result = runner.run(call)
        assert (result.ok, result.content) == (False, expected)
    good = runner.run(_call("calculator", expression="(12 + 7) * 3 / 4"))
    assert (good.content, good.ok, good.error) == ("14.25", True, None)


def test_results_that_are_not_strings_are_written_as_json():
    runner = ToolRunner([_tool("data", lambda: {"temp": 14.5, "ok": True}), _tool("obj", lambda: object)])
    assert runner.run(_call("data")).content == '{"temp": 14.5, "ok": true}'
    assert runner.run(_call("obj")).content == "<class 'object'>"


def test_runner_limits_are_checked_and_named():
    with pytest.raises(ConfigError, match="timeout_s = 0"):
        ToolRunner([], timeout_s=0)
    with pytest.raises(ConfigError, match="max_result_chars = 10: expected an integer >= 200"):
        ToolRunner([], max_result_chars=10)
    with pytest.raises(ConfigError, match="two tools are named 'calculator'"):
        ToolRunner(resolve_tools("calculator") * 2)


# ----------------------------------------------------------------------------- python, in the sandbox


def test_the_python_tool_runs_in_the_sandbox_and_shows_what_happened():
    runner = ToolRunner(resolve_tools("python"), timeout_s=2.0)
    printed = runner.run(_call("python", code="import os\nprint(6 * 7)\nprint(os.getcwd() != '/work/main')"))
    assert (printed.ok, printed.content) == (True, "42\nTrue")
    failed = runner.run(_call("python", code="print('before')\n1 / 0"))
    assert not failed.ok and failed.content.startswith("Error: before\nTraceback (most recent call last):")
    assert failed.content.endswith("ZeroDivisionError: division by zero\n[exit status 1]")
    assert failed.error == "failed: ZeroDivisionError: division by zero"
    start = time.monotonic()
    looped = runner.run(_call("python", code="while True:\n    pass"))
    assert time.monotonic() - start < 6.0 and not looped.ok and "[timed out after" in looped.content
    offline = runner.run(_call("python", code="import socket\nsocket.create_connection(('1.1.1.1', 53), 1)"))
    assert not offline.ok and ("network access is disabled" in offline.content or "unreachable" in offline.content)


def test_run_many_runs_sandboxed_calls_at_the_same_time_and_keeps_the_order():
    runner = ToolRunner(resolve_tools("python,calculator"), timeout_s=20.0)
    timed = "import time\nstart = time.time()\ntime.sleep(1.5)\nprint(start, time.time())"
    results = runner.run_many([_call("python", code=timed), _call("calculator", expression="2 * 21"),
                               ToolCall("nope", "{}"), _call("python", code=timed)])
    assert [r.ok for r in results] == [True, True, False, True] and results[1].content == "42"
    assert results[2].content.startswith("Error: there is no tool 'nope'")
    (start_a, end_a), (start_b, end_b) = (map(float, results[k].content.split()) for k in (0, 3))
    assert max(start_a, start_b) < min(end_a, end_b)  # the two programs overlapped
    assert runner.run_many([]) == []


# ----------------------------------------------------------------------------- user tools


WEATHER = textwrap.dedent('''
    from typing import Literal, Optional

    def get_weather(city: str, days: int = 1, unit: Literal["C", "F"] = "C", hourly: bool = False,
                    stations: Optional[list[str]] = None) -> str:
        """The weather forecast for a city.

        Looks it up in the local table.

        Args:
            city: the city's name,
                for example "Paris"
            days (int): how many days ahead
            unit: the temperature scale
            hourly: one line per hour
            stations: which stations to average

        Returns:
            the forecast as text
        """
        return f"{city}: 14.5 {unit} for {days} day(s)"

    def numpy_style(x: float, labels: dict):
        """Scale a value.

        Parameters
        ----------
        x : float
            The value
            to scale.
        labels : dict
            Names for the result.
        """
        return x * 2

    def untyped(x):
        return x

    def odd(x: set):
        return x

    def varargs(*values: int):
        return sum(values)
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "gu_user_tools.py").write_text(WEATHER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gu_user_tools", raising=False)
    return "gu_user_tools"


def test_a_user_tools_schema_comes_from_its_signature_and_docstring(user_module):
    tool = user_tool(f"{user_module}:get_weather")
    assert tool.schema() == {"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "the city's name, for example \"Paris\""},
            "days": {"type": "integer", "description": "how many days ahead", "default": 1},
            "unit": {"type": "string", "enum": ["C", "F"], "description": "the temperature scale", "default": "C"},
            "hourly": {"type": "boolean", "description": "one line per hour", "default": False},
            "stations": {"type": "array", "items": {"type": "string"}, "description": "which stations to average"},
        }, "required": ["city"]}}}
    numpy = user_tool(f"{user_module}:numpy_style")
    assert numpy.description == "Scale a value."
    assert numpy.parameters == {"type": "object", "properties": {
        "x": {"type": "number", "description": "The value to scale."},
        "labels": {"type": "object", "description": "Names for the result."}}, "required": ["x", "labels"]}
    runner = ToolRunner([tool])
    assert runner.run(_call("get_weather", city="Oslo", days=2)).content == "Oslo: 14.5 C for 2 day(s)"
    assert runner.run(_call("get_weather", city="Oslo", unit="K")).content == \
        "Error: argument 'unit' of get_weather must be one of ['C', 'F'], got 'K'"


def test_user_tools_that_cannot_work_are_config_errors_naming_them(user_module):
    cases = {
        "no_such_module_xyz:f": "tool 'no_such_module_xyz:f': cannot import 'no_such_module_xyz' "
                                "(ModuleNotFoundError: No module named 'no_such_module_xyz')",
        f"{user_module}:get_wether": f"tool '{user_module}:get_wether': {user_module} has no function "
                                     "'get_wether' (did you mean 'get_weather'?)",
        f"{user_module}:untyped": f"tool '{user_module}:untyped': parameter 'x' has no type hint",
        f"{user_module}:odd": f"tool '{user_module}:odd': parameter 'x': type set has no JSON schema",
        f"{user_module}:varargs": f"tool '{user_module}:varargs': parameter *values: int: *args and **kwargs",
        "justaname:": "tool 'justaname:': expected module:function",
    }
    for spec, message in cases.items():
        with pytest.raises(ConfigError) as e:
            user_tool(spec)
        assert str(e.value).startswith(message) and e.value.key == "tools", str(e.value)


def test_resolve_tools_reads_a_spec_in_order_and_names_an_unknown_tool(user_module):
    tools = resolve_tools(f"calculator, python,{user_module}:get_weather")
    assert [t.name for t in tools] == ["calculator", "python", "get_weather"]
    assert [t.name for t in resolve_tools(["python"])] == ["python"] and resolve_tools("") == []
    with pytest.raises(ConfigError, match=r"unknown tool 'calculater' \(did you mean 'calculator'\?\)"):
        resolve_tools("calculater")
    with pytest.raises(ConfigError, match="'python' is named twice"):
        resolve_tools("python,python")
