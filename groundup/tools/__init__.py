"""Tools a model calls: the calculator, the sandboxed `python`, `module:function` user tools, the runner.

    from groundup.tools import ToolRunner, resolve_tools
    runner = ToolRunner(resolve_tools("calculator,python,weather:get_weather"), timeout_s=10.0)
    runner.schemas()                              # OpenAI's `tools` list, for the chat template
    runner.run(call)                              # ToolResult(content, ok, error, seconds); never raises
    runner.run_many(calls)                        # in order; sandboxed calls at the same time

    base.py         Tool (name, description, JSON schema, fn; .schema()), ToolResult, ToolFailed
    calculator.py   safe arithmetic read with `ast` (no eval), bounded
    python_tool.py  the model's code run in the evaluation sandbox (groundup/sandbox)
    user.py         `module:function`: the schema from the signature, type hints and docstring
    registry.py     resolve_tools: names to tools
    runner.py       ToolRunner: arguments checked, time-limited, results cut to size, errors as results
"""

from groundup.tools.base import Tool, ToolFailed, ToolResult
from groundup.tools.calculator import calculate, calculator
from groundup.tools.python_tool import python_tool
from groundup.tools.registry import BUILTIN, resolve_tools
from groundup.tools.runner import ToolRunner
from groundup.tools.user import schema_of, user_tool

__all__ = ["BUILTIN", "Tool", "ToolFailed", "ToolResult", "ToolRunner", "calculate", "calculator", "python_tool",
           "resolve_tools", "schema_of", "user_tool"]
