"""Running the tools a model calls. The promise: `ToolRunner.run` never raises for anything a call or a tool does.

An unknown tool, arguments that are not a JSON object, an argument the tool does not take, a required one
missing, one of the wrong JSON type, a tool that raises, one that runs past `timeout_s`, and a result
longer than `max_result_chars` each come back as a ToolResult with ok=False whose content, starting
"Error: ", is what the model reads next, so it can fix its call. A result is cut to `max_result_chars`
characters in all, the cut said in its last line. `run_many` runs a batch of calls (a tool loop's round):
sandboxed ones at the same time, the others one by one, the results in order.

How the time limit holds:
- `python` (Tool.isolated) runs in the sandbox, a process of its own that the sandbox kills at the time
  limit: the runner calls it directly and hands it `timeout_s`.
- Every other tool (the calculator, `module:function` user tools) runs in a daemon worker thread, and the
  runner waits at most `timeout_s` for it. A thread, not a subprocess, because a user tool is the user's
  own trusted code that may hold state a subprocess would not see (a loaded index, a client, a cache)
  and its arguments and result need not pickle; the price is that Python cannot kill a thread, so a tool
  that never returns keeps its thread (a daemon: it does not hold the process open at exit) while
  generation goes on. Code a model wrote never runs this way: it goes to `python`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from groundup.config import ConfigError, did_you_mean, fail
from groundup.tools.base import Tool, ToolFailed, ToolResult

_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
               "array": (list,), "object": (dict,), "null": (type(None),)}
MIN_RESULT_CHARS = 200  # room for the note that says a result was cut


def _type_ok(value, schema: dict) -> bool:
    kinds = schema.get("type")
    if kinds is None:
        return True
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        allowed = _JSON_TYPES.get(kind)
        if allowed is None:
            return True  # a type this light check does not know: the tool judges
        if isinstance(value, allowed) and not (isinstance(value, bool) and kind in ("integer", "number")):
            return True
    return False


def check_arguments(tool: Tool, arguments: str) -> dict:
    """The call's arguments as keywords for `tool.fn`; ToolFailed saying what is wrong with them."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError as e:
        raise ToolFailed(f"the arguments are not valid JSON ({e.msg} at character {e.pos}): "
                         f"{str(arguments)[:100]!r}") from None
    if not isinstance(value, dict):
        raise ToolFailed(f"the arguments must be a JSON object, not {type(value).__name__}")
    properties = tool.parameters.get("properties", {})
    takes = ", ".join(properties) or "no arguments"
    for name in value:
        if name not in properties:
            raise ToolFailed(f"{tool.name} has no argument {name!r}{did_you_mean(name, properties)}; "
                             f"it takes: {takes}")
    for name in tool.parameters.get("required", []):
        if name not in value:
            raise ToolFailed(f"{tool.name} needs the argument {name!r}; it takes: {takes}")
    for name, given in value.items():
        schema = properties[name]
        if not _type_ok(given, schema) and not (given is None and name not in tool.parameters.get("required", [])):
            raise ToolFailed(f"argument {name!r} of {tool.name} must be of JSON type {schema['type']}, "
                             f"got {json.dumps(given)[:60]}")
        if "enum" in schema and given not in schema["enum"]:
            raise ToolFailed(f"argument {name!r} of {tool.name} must be one of {schema['enum']}, got {given!r}")
    return value


def as_text(value) -> str:
    """A tool's return value as the text the model reads: a string as it is, anything else as JSON (or str)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ToolFailed) else f"{type(exc).__name__}: {exc}"


class ToolRunner:
    """Runs calls (tokenizer.tool_calls.ToolCall: name and JSON arguments) against a set of tools."""

    def __init__(self, tools: Sequence[Tool], timeout_s: float = 10.0, max_result_chars: int = 2000):
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            fail("timeout_s", timeout_s, "a number of seconds > 0")
        if not isinstance(max_result_chars, int) or max_result_chars < MIN_RESULT_CHARS:
            fail("max_result_chars", max_result_chars, f"an integer >= {MIN_RESULT_CHARS}")
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ConfigError(f"two tools are named {tool.name!r}", key="tools")
            self.tools[tool.name] = tool
        self.timeout_s = float(timeout_s)
        self.max_result_chars = max_result_chars

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def schemas(self) -> list[dict]:
        """OpenAI's `tools` list: what the chat template shows the model."""
        return [tool.schema() for tool in self.tools.values()]

    def run(self, call) -> ToolResult:
        """The result of one call; never raises (see the module docstring)."""
        start = time.monotonic()
        try:
            name = getattr(call, "name", None)
            tool = self.tools.get(name) if isinstance(name, str) else None
            if tool is None:
                raise ToolFailed(f"there is no tool {name!r}{did_you_mean(name, self.tools)}; the tools are: "
                                 + (", ".join(self.tools) or "none"))
            arguments = check_arguments(tool, getattr(call, "arguments", None))
            if tool.isolated:
                value = tool.fn(**arguments, timeout_s=self.timeout_s)
            else:
                value = self._in_thread(tool, arguments)
            return self._result(as_text(value), None, start)
        except Exception as e:  # noqa: BLE001 - the promise: whatever happened, the model reads it
            message = describe(e)
            reason = getattr(e, "reason", None) or (message.strip().splitlines() or [type(e).__name__])[0]
            return self._result(f"Error: {message}", reason[:200], start)

    def run_many(self, calls: Sequence, workers: int | None = None) -> list[ToolResult]:
        """The results of several calls, in order; never raises. Calls to sandboxed tools (Tool.isolated: each
        a process of its own) run at the same time, up to `workers` (default: one per CPU); the others run
        one after another in order, since a user's function need not be thread-safe."""
        isolated = [k for k, call in enumerate(calls)
                    if getattr(self.tools.get(getattr(call, "name", None)), "isolated", False)]
        results: list[ToolResult | None] = [None] * len(calls)
        with ThreadPoolExecutor(max_workers=max(1, min(len(isolated), workers or os.cpu_count() or 1))) as pool:
            running = {k: pool.submit(self.run, calls[k]) for k in isolated} if len(isolated) > 1 else {}
            for k, call in enumerate(calls):
                if k not in running:
                    results[k] = self.run(call)
            for k, future in running.items():
                results[k] = future.result()
        return results

    def _in_thread(self, tool: Tool, arguments: dict):
        box: dict = {}

        def work():
            try:
                box["value"] = tool.fn(**arguments)
            except BaseException as e:  # noqa: BLE001 - SystemExit from a tool is a failed call, not an exit
                box["error"] = e

        worker = threading.Thread(target=work, name=f"tool-{tool.name}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise ToolFailed(f"{tool.name} did not finish within {self.timeout_s:g} s (timed out)")
        error = box.get("error")
        if error is not None and not isinstance(error, Exception):  # SystemExit, KeyboardInterrupt: the tool's
            raise ToolFailed(f"{tool.name} raised {type(error).__name__}: {error}")
        if error is not None:
            raise error
        return box["value"]

    def _result(self, content: str, error: str | None, start: float) -> ToolResult:
        if len(content) > self.max_result_chars:
            note = f"\n[truncated: the result was {len(content)} characters, the first {{}} are shown]"
            keep = self.max_result_chars - len(note.format(self.max_result_chars))
            content = content[:keep] + note.format(keep)
            error = error or f"the result was cut to {self.max_result_chars} characters"
        return ToolResult(content, error is None, error, time.monotonic() - start)
