"""User tools: any importable Python function, named `module:function`, with its schema read from the function.

    # weather.py, on PYTHONPATH
    def get_weather(city: str, unit: Literal["C", "F"] = "C") -> str:
        '''The current temperature in a city.

        Args:
            city: the city's name, e.g. "Paris"
            unit: the temperature scale
        '''

`user_tool("weather:get_weather")` gives the Tool `get_weather`: the docstring's first paragraph is its
description, each parameter's type hint its JSON type (str string, int integer, float number, bool
boolean, list[X] array, dict object, Literal enum, X | None as X), each line of the docstring's
"Args:" (Google style) or "Parameters" (NumPy style) section its description, a parameter without a
default is required, and a JSON-writable default is written as `default`. A missing module or function,
a parameter without a type hint, *args/**kwargs, or a type JSON cannot carry is a ConfigError that
names the tool and the parameter.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import types
import typing

from groundup.config import ConfigError, did_you_mean
from groundup.tools.base import Tool

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:?\s*$")
_OTHER_SECTION = re.compile(r"^\s*(Returns?|Yields?|Raises?|Examples?|Notes?|See Also|References)\s*:?\s*$")
_ENTRY = re.compile(r"^\s*\*{0,2}(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _fail(spec: str, message: str) -> typing.NoReturn:
    raise ConfigError(f"tool {spec!r}: {message}", key="tools")


def type_schema(hint, where: str) -> dict:
    """The JSON schema of a type hint; TypeError naming `where` for one JSON cannot carry."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if hint in (list, tuple) or origin in (list, tuple):
        items = [a for a in args if a is not Ellipsis]
        return {"type": "array", **({"items": type_schema(items[0], where)} if len(set(items)) == 1 else {})}
    if hint is dict or origin is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in _SIMPLE:
            raise TypeError(f"{where}: a Literal of one JSON type (str, int, float or bool), got {hint}")
        return {"type": _SIMPLE[next(iter(kinds))], "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:  # Optional[X]: X, and the default (None) says it may be left out
            return type_schema(rest[0], where)
        return {"anyOf": [type_schema(a, where) for a in rest]}
    raise TypeError(f"{where}: type {getattr(hint, '__name__', hint)!s} has no JSON schema "
                    "(use str, int, float, bool, list, dict, Literal or X | None)")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a docstring: its first paragraph, and the entries of its
    Google-style "Args:" or NumPy-style "Parameters" section (an entry's text may run over several lines)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    first = []
    for line in lines:
        if not line.strip() or _SECTION.match(line):
            break
        first.append(line.strip())
    described: dict[str, str] = {}
    inside, name, base = False, None, None
    for line in lines:
        if _SECTION.match(line) or _OTHER_SECTION.match(line):
            inside, name, base = bool(_SECTION.match(line)), None, None
            continue
        if not inside or not line.strip() or set(line.strip()) == {"-"}:  # NumPy underlines its headings
            continue
        width = len(line) - len(line.lstrip())
        head = _ENTRY.match(line)
        if head and (base is None or width <= base):
            name, base = head.group(1), width
            # "name (type): text" and "name: text" are Google's; "name : type" is NumPy's (text below)
            numpy = head.group(2) is None and line[head.end(1)].isspace()
            described[name] = "" if numpy else head.group(3).strip()
        elif name is not None and width > base:
            described[name] = (described[name] + " " + line.strip()).strip()
    return " ".join(first), described


def schema_of(fn, spec: str | None = None) -> dict:
    """The JSON schema (type "object") of a function's parameters; ConfigError naming what it cannot carry."""
    spec = spec or getattr(fn, "__name__", repr(fn))
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
    except (TypeError, ValueError, NameError) as e:
        _fail(spec, f"cannot read the function's signature ({e})")
    _, described = parse_docstring(inspect.getdoc(fn))
    properties, required = {}, []
    for name, p in signature.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            _fail(spec, f"parameter {p}: *args and **kwargs have no schema; name each parameter")
        if p.kind is p.POSITIONAL_ONLY:
            _fail(spec, f"parameter {name!r} is positional-only; a call passes arguments by name")
        if name not in hints:
            _fail(spec, f"parameter {name!r} has no type hint (the model needs its type)")
        try:
            prop = type_schema(hints[name], f"parameter {name!r}")
        except TypeError as e:
            _fail(spec, str(e))
        if described.get(name):
            prop["description"] = described[name]
        if p.default is p.empty:
            required.append(name)
        elif p.default is not None:
            try:
                json.dumps(p.default)
                prop["default"] = p.default
            except (TypeError, ValueError):
                pass  # a default JSON cannot write is simply not shown
        properties[name] = prop
    return {"type": "object", "properties": properties, "required": required}


def user_tool(spec: str) -> Tool:
    """The Tool for `module:function`; ConfigError when the module or function is missing or unusable."""
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        _fail(spec, "expected module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - a user module may fail to import in any way: name it
        _fail(spec, f"cannot import {module_name!r} ({type(e).__name__}: {e})")
    fn = getattr(module, func_name, None)
    if fn is None:
        public = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        _fail(spec, f"{module_name} has no function {func_name!r}{did_you_mean(func_name, public)}")
    if not callable(fn):
        _fail(spec, f"{module_name}.{func_name} is not a function")
    description, _ = parse_docstring(inspect.getdoc(fn))
    return Tool(name=func_name, description=description, parameters=schema_of(fn, spec), fn=fn)
