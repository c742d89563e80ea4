"""The shape of a JSON file a user may hand over, checked before anything reads it.

    check(index, {"format": str, "vocab_size": int, "bos_id?": (int, None), "splits": {"train": SPLIT}},
          where="out/tokens/index.json")

A schema is a type (or a tuple of types, `None` meaning null), a dict of keys to schemas (a key
ending in "?" may be missing; other keys are ignored), or a one-item list (every element has that
schema). A mismatch is a DataError naming the file, the key path and what was expected, so valid
JSON of the wrong shape (a list where an object belongs, a string count) is one clear message.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from groundup.errors import DataError

_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
          bool: "true or false", type(None): "null"}


def _describe(schema) -> str:
    if isinstance(schema, dict):
        return "an object"
    if isinstance(schema, list):
        return "a list"
    types = schema if isinstance(schema, tuple) else (schema,)
    if any(isinstance(t, (dict, list)) for t in types):
        return " or ".join(_describe(t) for t in types)
    return " or ".join(_NAMES.get(type(None) if t is None else t, getattr(t, "__name__", str(t))) for t in types)


def _is(value: Any, schema) -> bool:
    types = tuple(type(None) if t is None else t for t in (schema if isinstance(schema, tuple) else (schema,)))
    if isinstance(value, bool) and bool not in types:
        return False  # JSON true is not an integer here
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        return True
    return isinstance(value, types)


def check(value: Any, schema, where: str, path: str = "") -> None:
    """Raise DataError naming `where`, the key path and the expectation unless `value` fits `schema`."""
    here = path or "the top level"
    if isinstance(schema, tuple) and any(isinstance(t, (dict, list)) for t in schema):  # a union with structure
        for alternative in schema:
            try:
                check(value, alternative, where, path)
                return
            except DataError:
                continue
        raise DataError(f"{where}: {here}: expected {' or '.join(_describe(t) for t in schema)}, got {value!r:.60}")
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise DataError(f"{where}: {here}: expected an object, got {_NAMES.get(type(value), type(value).__name__)}")
        for key, sub in schema.items():
            optional = key.endswith("?")
            name = key.rstrip("?")
            if name not in value:
                if optional:
                    continue
                raise DataError(f"{where}: missing key '{path + '.' if path else ''}{name}'")
            check(value[name], sub, where, f"{path}.{name}" if path else name)
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise DataError(f"{where}: {here}: expected a list, got {_NAMES.get(type(value), type(value).__name__)}")
        for i, item in enumerate(value):
            check(item, schema[0], where, f"{path}[{i}]")
    elif not _is(value, schema):
        raise DataError(f"{where}: {here}: expected {_describe(schema)}, got {value!r:.60}")


def relative_file(name: str, where: str, key: str) -> str:
    """A file name a metadata file lists: relative and inside its directory (no '..', no absolute path)."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or "\\" in name or not name:
        raise DataError(f"{where}: {key} = {name!r}: expected a file inside the directory (no '..' or absolute path)")
    return name
