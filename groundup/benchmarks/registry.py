"""Task names as lm-evaluation-harness spells them, a few aliases, groups, and custom TOML tasks.

    get_task("hellaswag")                      # a Task; unknown names get a did-you-mean hint
    resolve_tasks("arc_easy,gsm8k")            # [arc_easy, gsm8k_cot]  (aliases resolve)
    resolve_tasks("core")                      # every multiple-choice benchmark, MMLU included
    resolve_tasks("my_task.toml,piqa")         # a custom task file (see custom.py) and a benchmark

Building a Task reads nothing; its files are read on the first `items()` call and cached.
"""

from __future__ import annotations

from pathlib import Path

from groundup.benchmarks import multiple_choice
from groundup.benchmarks.base import Task
from groundup.benchmarks.builtin import ALIASES, FACTORIES, GROUPS
from groundup.benchmarks.custom import load_custom_task
from groundup.config import did_you_mean
from groundup.errors import ConfigError

def task_names() -> list[str]:
    """Every built-in task name (lm-eval's spelling), MMLU subjects included."""
    return list(FACTORIES)


def _known_summary() -> str:
    names = [n for n in FACTORIES if not n.startswith("mmlu_")]
    return (
        f"known tasks: {', '.join(names)}, mmlu_<subject> ({len(multiple_choice.MMLU_SUBJECTS)} subjects); "
        f"groups: {', '.join(GROUPS)}; aliases: {', '.join(f'{a}={t}' for a, t in ALIASES.items())}; "
        "or a custom task .toml file"
    )


def get_task(name: str) -> Task:
    """The built-in task `name` (or an alias of one)."""
    key = ALIASES.get(name, name)
    if key in FACTORIES:
        return FACTORIES[key]()
    if name in GROUPS:
        raise ConfigError(f"'{name}' is a group of tasks, not one task: use resolve_tasks('{name}')", key="tasks")
    candidates = [*FACTORIES, *ALIASES, *GROUPS]
    raise ConfigError(f"unknown task '{name}'{did_you_mean(name, candidates)}; {_known_summary()}", key="tasks")


def resolve_tasks(spec: str) -> list[Task]:
    """Comma-separated task names, aliases, group names and custom task .toml paths, in order,
    each task once."""

    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not parts:
        raise ConfigError(f"no tasks given ({_known_summary()})", key="tasks")
    tasks: list[Task] = []
    seen: set[str] = set()
    for part in parts:
        if part.endswith(".toml") or (("/" in part or "\\" in part) and Path(part).exists()):
            found = [load_custom_task(part)]
        elif part in GROUPS:
            found = [get_task(n) for n in GROUPS[part]]
        else:
            found = [get_task(part)]
        for task in found:
            if task.name not in seen:
                seen.add(task.name)
                tasks.append(task)
    return tasks
