"""What a tool is, and what running one gives back.

A `Tool` is a name, a description and a JSON schema of its arguments (what the model reads in the
system turn, in OpenAI's shape: `schema()`), plus the Python function that does the work. The function
takes the call's arguments as keywords and returns a string (anything else is written as JSON, or with
`str` when it is not JSON). A `ToolResult` is what the model sees next: its text, whether the call
worked, why not, and how long it took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # a JSON schema of type "object": the arguments' names, types and descriptions
    fn: Callable[..., Any]  # called with the arguments as keywords
    # True: `fn` does its work in a process of its own under its own limits (the sandboxed `python`) and
    # takes `timeout_s=` besides its arguments, so the runner calls it directly with its time limit
    # instead of watching it from a worker thread. False: an ordinary function (see runner.py).
    isolated: bool = False

    def schema(self) -> dict:
        """The definition as OpenAI's `tools` list holds it."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


class ToolFailed(Exception):
    """A tool's own way to say a call failed: the model reads the message as it is (no exception type);
    `reason`, when given, is the one-line ToolResult.error (else the message's first line)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ToolResult:
    content: str  # what the model reads as the tool's answer (an error says "Error: ..." here)
    ok: bool  # False: the call failed, timed out, was refused, or its result was cut
    error: str | None  # why it is not ok, in one line; None when ok
    seconds: float  # wall-clock time of the call
