"""Tools by name: `resolve_tools("calculator,python,mymod:fn")` turns a spec into Tool objects.

A name with a colon is a user tool (`module:function`, user.py); any other name is a built-in. An
unknown name or the same tool twice is a ConfigError on the key `tools`, with a did-you-mean.
"""

from __future__ import annotations

from typing import Callable

from groundup.config import ConfigError, did_you_mean
from groundup.tools.base import Tool
from groundup.tools.calculator import calculator
from groundup.tools.python_tool import python_tool
from groundup.tools.user import user_tool

BUILTIN: dict[str, Callable[[], Tool]] = {"calculator": calculator, "python": python_tool}


def resolve_tools(spec: str | list[str] | tuple[str, ...] | None) -> list[Tool]:
    """The tools a spec names, in its order: a comma-separated string or a list of names."""
    if spec is None:
        return []
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    tools: list[Tool] = []
    for raw in names:
        if not isinstance(raw, str):
            raise ConfigError(f"tools: expected tool names, got {raw!r}", key="tools")
        name = raw.strip()
        if not name:
            continue
        if ":" in name:
            tool = user_tool(name)
        elif name in BUILTIN:
            tool = BUILTIN[name]()
        else:
            raise ConfigError(f"tools: unknown tool {name!r}{did_you_mean(name, BUILTIN)}; the built-in tools are "
                              f"{', '.join(BUILTIN)}, and a Python function is named module:function", key="tools")
        if any(t.name == tool.name for t in tools):
            raise ConfigError(f"tools: {tool.name!r} is named twice", key="tools")
        tools.append(tool)
    return tools
