"""Typed configuration shared by every stage.

A stage's configuration is a dataclass whose fields have working defaults. A TOML file overrides
the defaults, and `section.key=value` arguments override the file. Every key is checked before any
work starts: an unknown key names its nearest valid spelling, a wrong type names the expected one,
and each dataclass may define `validate()` to reject impossible combinations.

    cfg = load_config(TrainConfig, "run.toml", ["model.n_layers=4", "optim.lr=1e-3"])
    save_config(cfg, run_dir / "config.toml")   # the fully resolved config, reloadable
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import inspect
import io
import math
import re
import tokenize
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from groundup.errors import ConfigError
from groundup.io import atomic_write_text, read_text

T = TypeVar("T")

__all__ = [
    "ConfigError",
    "apply_overrides",
    "config_diff",
    "config_template",
    "config_to_dict",
    "did_you_mean",
    "fail",
    "from_dict",
    "load_cli_config",
    "inputs_and_overrides",
    "load_config",
    "load_saved_config",
    "read_toml",
    "save_config",
    "saved_config",
    "to_toml",
]


def fail(key: str, value: Any, expected: str) -> typing.NoReturn:
    """Raise the standard message for a bad value: `key = value: expected ...`."""
    raise ConfigError(f"{key} = {value!r}: expected {expected}", key=key)


def did_you_mean(word: str, candidates: typing.Iterable[str], prefix: str = "", cutoff: float = 0.6) -> str:
    """` (did you mean 'X'?)` for the closest candidate, or ''. The one spelling hint every message uses."""
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=cutoff)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


# ----------------------------------------------------------------------------- reading


def read_toml(path: str | Path) -> dict:
    """A TOML file as a dict; missing, unreadable, non-UTF-8 or invalid files are a ConfigError naming it."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    text = read_text(path, ConfigError)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None


def _parse_value(text: str) -> Any:
    """Parse an override value as a TOML literal; anything unparsable stays a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict, overrides: typing.Sequence[str]) -> dict:
    """Apply `a.b.c=value` strings to a nested dict (in place) and return it."""
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected the form section.key=value")
        *parents, leaf = key.split(".")
        node = data
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parents[: i + 1])} is not a section")
            node = child
        node[leaf] = _parse_value(text.strip())
    return data


# ----------------------------------------------------------------------------- typing


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) if a is not type(None) else "none" for a in get_args(tp))
    if origin is list:
        return f"a list of {_type_name(get_args(tp)[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a table"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return str(tp)


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _coerce(value: Any, tp: Any, key: str, base: Any = None) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in options:
                return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError:
                pass
        fail(key, value, _type_name(tp))
    if origin is Literal:
        choices = get_args(tp)
        if value in choices:
            return value
        hint = did_you_mean(value, choices)
        raise ConfigError(f"{key} = {value!r}: expected {_type_name(tp)}{hint}", key=key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        fail(key, value, "true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # 1e6 written for a step count
            return int(value)
        fail(key, value, "an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # an infinite rate or threshold only ever means a run that never ends
                fail(key, value, "a finite number")
            return float(value)
        fail(key, value, "a number")
    if tp is str:
        if isinstance(value, str):
            return value
        fail(key, value, "a string")
    if origin is list:
        if not isinstance(value, list):
            fail(key, value, _type_name(tp))
        (item_tp,) = get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            fail(key, value, "a table")
        key_tp, val_tp = get_args(tp)
        return {str(k): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            fail(key, value, "a table")
        return from_dict(tp, value, prefix=f"{key}.", base=base if isinstance(base, tp) else None)
    if tp is Any:
        return value
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def from_dict(cls: type[T], data: dict, prefix: str = "", base: T | None = None) -> T:
    """Build a config dataclass from a (TOML-shaped) dict, checking every key and type.

    Keys missing from `data` keep their values in `base` (default: the class defaults), and a
    nested section starts from its field's default: if a parent's default for `model` is a
    4-layer model, `model.d_model = 64` changes only the width. `preset = NAME` in a section
    starts that section from the preset instead.

    A class may define `preprocess(data, prefix) -> data` (a classmethod; used to expand presets)
    and `validate()` (checks across keys; raises ConfigError with keys relative to the class).
    """
    if not isinstance(data, dict):
        fail(prefix.rstrip(".") or "config", data, "a table")
    if "preset" in data:
        base = None
    if hasattr(cls, "preprocess"):
        data = cls.preprocess(dict(data), prefix)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    if base is not None:
        base = copy.deepcopy(base)
        kwargs = {name: getattr(base, name) for name in fields}
    for key, value in data.items():
        if key not in fields:
            shown = f"{prefix}{key}" + (f".{next(iter(value))}" if isinstance(value, dict) and len(value) == 1 else "")
            why = getattr(cls, "moved_keys", {}).get(key)
            if why:
                raise ConfigError(f"unknown key '{shown}': {why}", key=prefix + key)
            raise ConfigError(
                f"unknown key '{shown}'{did_you_mean(key, fields, prefix)}; valid keys here: "
                + ", ".join(sorted(fields)),
                key=prefix + key,
            )
        section_base = kwargs.get(key, _field_default(fields[key])) if isinstance(value, dict) else None
        kwargs[key] = _coerce(value, hints[key], prefix + key, section_base)
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        try:
            obj.validate()
        except ConfigError as e:
            message = str(e)
            if prefix and e.key and message.startswith(e.key):  # name the key as the user wrote it
                raise ConfigError(prefix + message, key=prefix + e.key) from None
            raise
    return obj


def inputs_and_overrides(paths: typing.Sequence[Path]) -> tuple[list[Path], list[str]]:
    """Split `--input a.jsonl key=value`: argparse hands a trailing override to an nargs="+" --input,
    so an item holding "=" that is not an existing path is taken back as an override."""
    moved = [str(p) for p in paths if "=" in str(p) and not Path(p).exists()]
    return [Path(p) for p in paths if str(p) not in moved], moved


def load_config(cls: type[T], path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> T:
    """Defaults of `cls`, then the TOML file at `path`, then `section.key=value` overrides."""
    data = read_toml(path) if path else {}
    apply_overrides(data, overrides)
    return from_dict(cls, data)


def saved_config(cls: type[T], data: dict) -> T:
    """A config a run saved (RUN/config.toml, a checkpoint's meta.json): a class whose layout changed since
    may define `upgrade_saved(data) -> data` (a classmethod) to read what older runs wrote."""
    upgrade = getattr(cls, "upgrade_saved", None)
    return from_dict(cls, upgrade(copy.deepcopy(data)) if upgrade is not None else data)


def load_saved_config(cls: type[T], path: str | Path) -> T:
    """`saved_config` of a TOML file (a run's config.toml)."""
    return saved_config(cls, read_toml(path))


def load_cli_config(cls: type[T], args: argparse.Namespace, **flags) -> T:
    """Defaults, then --config, then key=value arguments, then the dedicated flags that were given
    (`args.input`, when present, gives back the overrides argparse put into it)."""
    moved: list[str] = []
    if getattr(args, "input", None) is not None:
        args.input, moved = inputs_and_overrides(args.input)
    extra = [f"{k}={v}" for k, v in flags.items() if v is not None]
    return load_config(cls, args.config, [*moved, *args.overrides, *extra])


# ----------------------------------------------------------------------------- writing


def config_to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_value(key)


def to_toml(cfg: Any, table: str = "") -> str:
    """Render a config dataclass (or a dict) as TOML: nested dataclasses become [sections].

    None values are written as comments: TOML has no null, and loading the file back leaves the
    field at its default (None for every optional field here).
    """
    if dataclasses.is_dataclass(cfg):
        items = [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg)]
        is_section = dataclasses.is_dataclass
    else:
        items = list(cfg.items())
        is_section = lambda v: isinstance(v, dict)  # noqa: E731  (plain dicts: nest as sections)
    lines, sections = [], []
    for key, value in items:
        if is_section(value):
            sections.append((key, value))
        elif value is None:
            lines.append(f"# {_toml_key(key)} = none")
        else:
            if dataclasses.is_dataclass(value):
                value = config_to_dict(value)
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    out = ([f"[{table}]"] if table and lines else []) + lines
    for key, value in sections:
        body = to_toml(value, f"{table}.{key}" if table else key)
        out.extend(([""] if out else []) + [body.rstrip("\n")])
    return "\n".join(out) + "\n"


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the fully resolved config as TOML (atomically); `load_config` reads it back."""
    atomic_write_text(Path(path), to_toml(cfg))


def config_diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Keys whose values differ between two configs, as `key: a -> b` lines."""
    da = config_to_dict(a) if dataclasses.is_dataclass(a) else a
    db = config_to_dict(b) if dataclasses.is_dataclass(b) else b
    out = []
    for key in sorted(set(da) | set(db)):
        va, vb = da.get(key), db.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(config_diff(va, vb, f"{prefix}{key}."))
        elif va != vb:
            out.append(f"{prefix}{key}: {va!r} -> {vb!r}")
    return out


# --------------------------------------------------------------------- templates (--print-config)


def field_comments(cls: type) -> dict[str, str]:
    """Each field of a config dataclass (and its bases) -> the comment that explains it in the source: the
    `# ...` after its declaration, else the comment lines right above it."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            lines, _ = inspect.getsourcelines(klass)
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in lines[1:]:
            text = line.strip()
            if text.startswith("#"):
                above.append(text.lstrip("#").strip())
                continue
            match = re.match(r"(\w+)\s*:", text)
            if match and not text.startswith(("def ", "return", "@")):
                name = match.group(1)
                trailing = _trailing_comment(line)
                if trailing or above:
                    out[name] = trailing or " ".join(above)
            above = []
    return out


def _trailing_comment(line: str) -> str:
    """The comment after code on a line, skipping '#' inside string literals."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError):
        return ""
    return next((t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT), "")


def _own_docstring(cls: type) -> str:
    doc = cls.__doc__ or ""
    return "" if doc.startswith(cls.__name__ + "(") else doc.strip().split("\n")[0]  # dataclass's made-up doc


def config_template(cfg: Any, table: str = "") -> str:
    """`to_toml(cfg)` with each key's meaning as a comment: what `--print-config` prints."""
    comments = field_comments(type(cfg))
    lines, sections = [], []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            sections.append((f.name, value))
            continue
        note = f"  # {comments[f.name]}" if f.name in comments else ""
        text = f"# {_toml_key(f.name)} = none" if value is None else f"{_toml_key(f.name)} = {_toml_value(value)}"
        lines.append(text + note)
    about = _own_docstring(type(cfg))
    out = ([f"# {about}"] if table and about and lines else []) + ([f"[{table}]"] if table and lines else []) + lines
    for key, value in sections:
        body = config_template(value, f"{table}.{key}" if table else key)
        out.extend(([""] if out else []) + [body.rstrip("\n")])
    return "\n".join(out) + "\n"
