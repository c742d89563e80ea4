"""The `python` tool: the model's code runs in the evaluation sandbox (groundup/sandbox), never in our process.

Each call is one `run_program`: a process of its own under limits on wall-clock time, CPU time, memory,
processes and output, with no network, in a fresh scratch folder that is removed afterwards (the
sandbox's docstring lists every layer). The interpreter is `default_python()`, the one the sandbox's
users can run. The model reads back what a person at a terminal would see: stdout, then stderr, then a
last line saying how the program ended when it did not end well (exit status, timeout, limit hit).
"""

from __future__ import annotations

from groundup.sandbox import default_python, run_program
from groundup.tools.base import Tool, ToolFailed


def format_run(result) -> str:
    """A SandboxResult as the text the model reads."""
    parts = [result.stdout] if result.stdout else []
    if result.stderr:
        parts.append(result.stderr)
    if result.status == "timeout":
        parts.append(f"[timed out after {result.seconds:.1f} s]")
    elif result.status == "killed":
        parts.append(f"[killed: {result.detail or 'a limit was hit'}]")
    elif result.status == "failed":
        parts.append(f"[exit status {result.returncode}]")
    if result.truncated:
        parts.append("[output cut at the sandbox's limit]")
    text = "\n".join(p.rstrip("\n") for p in parts)
    return text if text else "[no output]"


def python_tool(memory_mb: int = 512, max_processes: int = 16, max_output_bytes: int = 64 * 1024,
                python: str | None = None) -> Tool:
    """The sandboxed `python` tool; `python`: the interpreter (default: the sandbox's default_python())."""

    def run(code: str, timeout_s: float = 10.0) -> str:
        if not isinstance(code, str):
            raise TypeError("code must be a string")
        result = run_program(code, timeout=timeout_s, memory_mb=memory_mb, max_processes=max_processes,
                             max_output_bytes=max_output_bytes, python=python or default_python())
        if not result.passed:  # the output is still what the model must read: it is in the message
            raise ToolFailed(format_run(result), reason=f"{result.status}: {result.detail}".rstrip(": "))
        return format_run(result)

    return Tool(
        name="python",
        description="Run a Python program in a sandbox (no network, no files kept) and return what it "
                    "prints: stdout, then stderr and how it ended if it failed. Print the values you need.",
        parameters={"type": "object",
                    "properties": {"code": {"type": "string", "description": "the whole program, as a file holds it"}},
                    "required": ["code"]},
        fn=run,
        isolated=True,
    )
