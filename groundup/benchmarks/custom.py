"""Custom tasks: a TOML file over a JSONL file, prompted and scored like a built-in task.

    # my_task.toml                          # items.jsonl, one object a line:
    name = "capitals"                       # {"country": "France", "options": ["Paris", "Rome"], "answer": 0}
    data = "items.jsonl"                    # relative to the TOML file, inside its folder
    kind = "multiple_choice"                # or "generate"
    context = "Q: What is the capital of {country}?\\nA:"   # a Python format string over the fields
    choices = "options"                     # a field holding a list, or a list of format strings
    gold = "answer"                         # a field: the index of the right choice, or its text

    task = load_custom_task("my_task.toml")     # or resolve_tasks("my_task.toml")
    task.skipped                                # ["items.jsonl:7: missing field 'country' (context)", ...]

Generative tasks give `target` (a field name, or a format string when it contains "{") and `stop`
(lm-eval's `until`, default ["\\n\\n"]), and may give `tools` ("calculator,python" or a list: the model
answers each prompt, sent as a user message, through the tool loop; eval/generation.py). Optional for
both: `metric` (a name or a list), `num_fewshot` (default 0), `target_delimiter` (" "), `fewshot_delimiter`
("\\n\\n"), `description` (text before everything), `fewshot_data` (another JSONL file for the examples; by
default they come from the same file, never the item itself, drawn by lm-eval's seeded sampler), `random_baseline`
(default: the mean of 1/choices) and `strict`. A record that is not a JSON object, lacks a field a
key needs, or has an unusable choice list or gold is skipped and listed in `task.skipped` as
"file:line: reason (key)"; with `strict = true` the first such record raises DataError instead, and
a file with no usable record always does. A bad TOML key raises ConfigError naming the file and key.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from groundup.benchmarks.base import GenItem, Task, Template, build_context, lm_task, mc_item
from groundup.benchmarks.builtin import ALIASES, FACTORIES, GROUPS
from groundup.config import did_you_mean, read_toml
from groundup.errors import ConfigError, DataError

KINDS = ("multiple_choice", "generate")
# key -> (accepted types, description for the error message)
KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), "a task name"),
    "data": ((str,), "a JSONL path relative to the TOML file, inside its folder"),
    "kind": ((str,), f"one of {', '.join(KINDS)}"),
    "context": ((str,), "a format string such as '{question}'"),
    "choices": ((str, list), "a field name or a list of format strings"),
    "gold": ((str,), "the field holding the right choice's index or text"),
    "target": ((str,), "a field name or a format string"),
    "stop": ((str, list), "a list of stop strings"),
    "metric": ((str, list), "a metric name or a list of them"),
    "num_fewshot": ((int,), "an integer >= 0"),
    "target_delimiter": ((str,), "a string"),
    "fewshot_delimiter": ((str,), "a string"),
    "description": ((str,), "a string"),
    "fewshot_data": ((str,), "a JSONL path relative to the TOML file, inside its folder"),
    "random_baseline": ((int, float), "a number between 0 and 1"),
    "strict": ((bool,), "true or false"),
    "tools": ((str, list), "tools a generate task's model may call: calculator, python, module:function"),
}


class _BadRecord(Exception):
    pass


def _check_format(toml: Path, key: str, text: str) -> None:
    try:
        list(string.Formatter().parse(text))
    except ValueError as e:
        raise ConfigError(f"{toml}: {key} = {text!r}: not a valid format string ({e})", key=key) from None


def _fill(text: str, record: dict, key: str) -> str:
    try:
        return text.format_map(record)
    except KeyError as e:
        raise _BadRecord(f"missing field {e.args[0]!r} ({key})") from None
    except (IndexError, AttributeError, TypeError, ValueError) as e:
        raise _BadRecord(f"cannot fill {key} {text!r}: {e} ({key})") from None


def _field(record: dict, name: str, key: str) -> Any:
    if name not in record:
        raise _BadRecord(f"missing field {name!r} ({key})")
    return record[name]


def _read_config(path: Path) -> dict:
    cfg = read_toml(path)
    for key, value in cfg.items():
        if key not in KEYS:
            hint = did_you_mean(key, KEYS)
            raise ConfigError(f"{path}: unknown key '{key}'{hint}; known keys: {', '.join(KEYS)}", key=key)
        types, expected = KEYS[key]
        bad_bool = isinstance(value, bool) and bool not in types
        if bad_bool or not isinstance(value, types):
            raise ConfigError(f"{path}: {key} = {value!r}: expected {expected}", key=key)
    kind = cfg.setdefault("kind", "multiple_choice")
    if kind not in KINDS:
        hint = did_you_mean(kind, KINDS)
        raise ConfigError(f"{path}: kind = {kind!r}: expected one of {', '.join(KINDS)}{hint}", key="kind")
    needed = ["name", "data", "context"] + (["choices", "gold"] if kind == "multiple_choice" else ["target"])
    for key in needed:
        if key not in cfg:
            raise ConfigError(f"{path}: missing key '{key}' ({KEYS[key][1]}), needed by a {kind} task", key=key)

    if not cfg["name"].strip() or "," in cfg["name"]:
        raise ConfigError(f"{path}: name = {cfg['name']!r}: expected a non-empty name without commas", key="name")
    if cfg["name"] in FACTORIES or cfg["name"] in ALIASES or cfg["name"] in GROUPS:
        message = f"{path}: name = {cfg['name']!r} is a built-in task or group; choose another name"
        raise ConfigError(message, key="name")
    if cfg.get("num_fewshot", 0) < 0:
        raise ConfigError(f"{path}: num_fewshot = {cfg['num_fewshot']}: expected an integer >= 0", key="num_fewshot")
    if "tools" in cfg and kind != "generate":
        raise ConfigError(f"{path}: tools: only a generate task's model calls tools", key="tools")
    for key in ("choices", "stop", "metric", "tools"):
        value = cfg.get(key)
        if isinstance(value, list) and not (value and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{path}: {key} = {value!r}: expected a non-empty list of strings", key=key)
    for key in ("context", "target", "choices"):
        value = cfg.get(key, "")
        for text in value if isinstance(value, list) else [value]:
            _check_format(path, key, text)
    return cfg


def _normalize(cfg: dict, record: Any) -> dict:
    """The item's prompt parts from one JSON record, or _BadRecord with the reason."""
    if not isinstance(record, dict):
        raise _BadRecord(f"expected a JSON object, got {type(record).__name__}")
    doc: dict[str, Any] = {"text": _fill(cfg["context"], record, "context")}
    if cfg["kind"] == "generate":
        target = cfg["target"]
        value = _fill(target, record, "target") if "{" in target else _field(record, target, "target")
        doc["target"] = value if isinstance(value, str) else json.dumps(value)
        return doc
    spec = cfg["choices"]
    if isinstance(spec, list):
        choices = [_fill(c, record, "choices") for c in spec]
    else:
        choices = _field(record, spec, "choices")
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise _BadRecord(f"field {spec!r} is not a non-empty list of strings (choices)")
    gold = _field(record, cfg["gold"], "gold")
    if isinstance(gold, bool) or not isinstance(gold, (int, str)):
        raise _BadRecord(f"field {cfg['gold']!r} = {gold!r}: expected a choice index or a choice's text (gold)")
    if isinstance(gold, str):
        if gold not in choices:
            raise _BadRecord(f"field {cfg['gold']!r} = {gold!r} is not one of the choices (gold)")
        gold = choices.index(gold)
    elif not 0 <= gold < len(choices):
        raise _BadRecord(f"field {cfg['gold']!r} = {gold} is out of range for {len(choices)} choices (gold)")
    doc.update(choices=choices, gold=gold)
    return doc


def _read_records(cfg: dict, path: Path, toml: Path, skipped: list[str]) -> list[dict]:
    if not path.is_file():
        raise DataError(f"{toml}: data file not found: {path}")
    docs, bad = [], 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                try:
                    record = json.loads(raw.decode("utf-8").rstrip("\r\n"))
                except UnicodeDecodeError as e:
                    raise _BadRecord(f"not UTF-8 (byte {e.start + 1})") from None
                except json.JSONDecodeError as e:
                    raise _BadRecord(f"not valid JSON ({e.msg} at column {e.colno})") from None
                docs.append({**_normalize(cfg, record), "line": lineno})
            except _BadRecord as e:
                message = f"{path.name}:{lineno}: {e}"
                if cfg.get("strict"):
                    raise DataError(f"{path}:{lineno}: {e}") from None
                bad += 1
                skipped.append(message)
    if not docs:
        shown = "; ".join(skipped[-bad:][:3]) if bad else "the file has no records"
        raise DataError(f"{path}: no usable records ({bad} skipped: {shown})")
    return docs


def _inside(toml: Path, key: str, name: str) -> Path:
    """A data path of the task file, refused unless it resolves inside the task file's folder (symbolic
    links followed): a task file from someone else must not make eval read, and record in results.json,
    files elsewhere on the machine (`../../../etc/passwd`)."""
    folder = toml.parent.resolve()
    path = (folder / name).resolve()
    if not path.is_relative_to(folder):
        raise ConfigError(f"{toml}: {key} = {name!r} resolves to {path}, outside the task file's folder {folder}; "
                          "keep the data beside the task file", key=key)
    return path


def load_custom_task(path: str | Path) -> Task:
    """Read a custom task TOML and its JSONL items (all checked now; bad records listed in `skipped`)."""
    toml = Path(path)
    if not toml.is_file():
        raise ConfigError(f"custom task file not found: {toml}", key="tasks")
    cfg = _read_config(toml)
    data = _inside(toml, "data", cfg["data"])
    skipped: list[str] = []
    docs = _read_records(cfg, data, toml, skipped)
    files = [toml, data]
    if "fewshot_data" in cfg:
        pool_path = _inside(toml, "fewshot_data", cfg["fewshot_data"])
        pool = _read_records(cfg, pool_path, toml, skipped)
        files.append(pool_path)
    else:
        pool = docs
    mc = cfg["kind"] == "multiple_choice"
    tpl = Template(
        doc_to_text=lambda d: d["text"],
        doc_to_target=(lambda d: d["gold"]) if mc else (lambda d: d["target"]),
        doc_to_choice=(lambda d: d["choices"]) if mc else None,
        target_delimiter=cfg.get("target_delimiter", " "),
        fewshot_delimiter=cfg.get("fewshot_delimiter", "\n\n"),
        description=cfg.get("description", ""),
    )
    stop = cfg.get("stop", [tpl.fewshot_delimiter])
    stop = [stop] if isinstance(stop, str) else list(stop)

    def gen_item(item_id: str, tpl: Template, doc: dict, shots) -> GenItem:
        return GenItem(item_id, build_context(tpl, doc, shots), doc["target"], list(stop))

    metric = cfg.get("metric", ["acc"] if mc else ["exact_match"])
    baseline = cfg.get("random_baseline", sum(1 / len(d["choices"]) for d in docs) / len(docs) if mc else 0.0)
    if not 0 <= baseline <= 1:
        message = f"{toml}: random_baseline = {baseline}: expected a number between 0 and 1"
        raise ConfigError(message, key="random_baseline")
    return lm_task(
        cfg["name"], tpl, lambda: list(docs), lambda: list(pool), lambda: list(files),
        item=mc_item if mc else gen_item, exclude_self=pool is docs,
        kind=cfg["kind"], metrics=[metric] if isinstance(metric, str) else list(metric),
        random_baseline=float(baseline), num_fewshot=cfg.get("num_fewshot", 0), split=data.name, source=str(data),
        skipped=skipped, tools=_tools(cfg.get("tools")),
    )  # fmt: skip


def _tools(value: str | list | None) -> str | None:
    """The `tools` key as one spec string (resolve_tools reads it when the task runs)."""
    return ",".join(value) if isinstance(value, list) else value
