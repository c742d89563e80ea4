"""Tool calls in text: how tool definitions, calls and results are written into a chat, and read back out.

groundup's chat format writes them as the Hermes convention (NousResearch; Qwen2.5's templates use it
too), in plain text inside the usual turns, so every groundup tokenizer can carry them:

    system turn     the system message, then TOOLS_HEADER, the definitions as JSON lines in <tools></tools>
    assistant turn  its content, then one <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> per call
    tool result     a user turn holding <tool_response>RESULT</tool_response> (consecutive results: one turn)

`parse_tool_calls(text)` reads the calls out of a reply written that way (the content before the first
call is the message's content), and `ToolCallStream` does it as text streams in: content goes out as it
arrives, a call only once its closing tag is read, whole, so a streamed `delta.tool_calls` never holds
half a JSON argument string. The same parser reads Hugging Face models whose templates use the Hermes
tags (Qwen2.5, Hermes), and one tag holding a JSON list of calls
(SmolLM2's function-calling format) is those calls in order.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from groundup.errors import DataError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                "with function signatures within <tools></tools> XML tags:\n<tools>\n")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's `function.arguments`)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def check_tools(tools, where: str = "tools") -> list[dict]:
    """OpenAI's `tools`: a list of {"type": "function", "function": {"name", "description"?, "parameters"?}}."""
    if not isinstance(tools, list):
        raise DataError(f"{where}: expected a list of tool definitions")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise DataError(f"{where}[{i}]: expected {{\"type\": \"function\", \"function\": {{...}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise DataError(f"{where}[{i}].function.name: expected a non-empty string")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise DataError(f"{where}[{i}].function.parameters: expected a JSON schema object")
    return tools


def tools_text(tools: list[dict]) -> str:
    """The system-turn text that defines the tools."""
    return TOOLS_HEADER + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_FOOTER


def call_text(call: dict) -> str:
    """One OpenAI tool call ({"function": {"name", "arguments"}}) as the assistant writes it."""
    fn = call.get("function", call)
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI's form: used as written (the chat template can only copy it)
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            raise DataError(f"tool call {fn.get('name')!r}: arguments are not JSON: {arguments[:80]!r}") from None
    else:
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f'{CALL_OPEN}\n{{"name": {json.dumps(fn.get("name"), ensure_ascii=False)}, "arguments": {arguments}}}\n{CALL_CLOSE}'


def response_text(content: str) -> str:
    return RESPONSE_OPEN + content + RESPONSE_CLOSE


def _one(value) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ToolCall(value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False))


def _calls(body: str) -> list[ToolCall] | None:
    """The calls in one tag: a call object, or a JSON list of them (SmolLM2's and xLAM's format,
    `<tool_call>[{"name": ..., "arguments": ...}, ...]</tool_call>`); None when it is not that."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    calls = [_one(v) for v in value] if isinstance(value, list) else [_one(value)]
    return calls if calls and None not in calls else None


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply; a malformed call is left in the content, as text."""
    stream = ToolCallStream()
    content = stream.push(text) + stream.finish()
    return content, stream.calls


class ToolCallStream:
    """Content as it arrives; each tool call once whole (see the module docstring)."""

    def __init__(self):
        self.buffer = ""
        self.calls: list[ToolCall] = []
        self.new_calls: list[ToolCall] = []  # calls completed by the last push
        self.after_call = False

    def push(self, text: str) -> str:
        """Add streamed text; return the content that can be shown now (calls go to `new_calls`)."""
        self.buffer += text
        self.new_calls = []
        out = ""
        while True:
            if self.after_call:  # the newlines that separate calls are not content
                self.buffer = self.buffer.lstrip("\n")
                if not self.buffer:
                    return out
                self.after_call = False
            start = self.buffer.find(CALL_OPEN)
            if start < 0:
                keep = _partial_suffix(self.buffer, CALL_OPEN)  # the start of a tag that may be arriving
                out += self.buffer[: len(self.buffer) - keep]
                self.buffer = self.buffer[len(self.buffer) - keep:]
                return out
            out += self.buffer[:start]
            end = self.buffer.find(CALL_CLOSE, start)
            if end < 0:
                self.buffer = self.buffer[start:]
                return out
            calls = _calls(self.buffer[start + len(CALL_OPEN) : end].strip())
            if calls is None:  # not a call after all: show it as text
                out += self.buffer[start : end + len(CALL_CLOSE)]
            else:
                self.calls.extend(calls)
                self.new_calls.extend(calls)
                self.after_call = True
            self.buffer = self.buffer[end + len(CALL_CLOSE):]

    def finish(self) -> str:
        """The text still held back (an unfinished call is shown as text)."""
        out, self.buffer = self.buffer, ""
        return out


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
