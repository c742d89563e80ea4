"""Rewards: Python functions `f(prompt, completion, **fields) -> float`, combined with weights.

    rewards = load_rewards(["exact_match", "format_answer", "my_rewards:brevity"], weights=[1.0, 0.2, 0.1])
    total, parts, error = score(rewards, prompt, completion, {"answer": "42"})

A reward is named by `module:function` (any importable module, e.g. a file on PYTHONPATH), by
`rm:PATH` (a reward model trained with `groundup reward-model`), by `prm:PATH` (a process reward model,
`groundup rm --process`: the solution's lowest step score), or by a shipped name:
    exact_match / exact_match_strict   1 if the `Answer: N` line equals the record's `answer`
    exact_match_lenient                1 if the last number in the completion equals `answer`
    format_answer                      1 if the completion has an `Answer: N` line (a format reward)
    code                               1 if `prompt + completion` passes the record's `tests` in the
                                       evaluation sandbox (a separate process with limits, never exec);
                                       a chat reply's last ```python block is its code (code_tests.py)
    tests_passed                       the share of the record's tests that pass (each assert of `tests`
                                       counted; HumanEval's check(candidate) too), in one sandbox run
Extra fields of the prompt's record (answer, tests, entry_point, ...) are passed as keyword arguments;
a field named `prompt`, `completion` or `messages` (a TRL prompt-completion file's reference
completion) is not, as TRL's trainers leave it out: those names are the call's own arguments.
A reward that raises (or calls sys.exit) or returns something other than a finite number scores 0
for that completion, and the failure is counted and reported with the record (`error`), never a
crash of the run; a run whose rewards fail on every call stops (rewards/health.py).
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass, field
from typing import Callable

from groundup.config import ConfigError, did_you_mean
from groundup.rewards.code_tests import code_program, count_passed
from groundup.rewards.model_scorer import RewardModelScorer
from groundup.rewards.process_scorer import ProcessRewardScorer
from groundup.sandbox import check_completion, default_python

RewardFn = Callable[..., float]
_ANSWER_LINE = re.compile(r"Answer:\s*-?[\d,]+")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_ANSWER = re.compile(r"Answer:\s*(-?[\d,]+(?:\.\d+)?)")


def extract_answer(text: str, strict: bool) -> str | None:
    """The answer a reply gives: the `Answer:` line (strict) or the last number in it (lenient)."""
    if strict:
        m = _ANSWER.search(text)
        return m.group(1).replace(",", "") if m else None
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def exact_match(prompt: str, completion: str, answer=None, **_) -> float:
    return float(answer is not None and extract_answer(completion, True) == str(answer).replace(",", ""))


def exact_match_lenient(prompt: str, completion: str, answer=None, **_) -> float:
    return float(answer is not None and extract_answer(completion, False) == str(answer).replace(",", ""))


def format_answer(prompt: str, completion: str, **_) -> float:
    return float(bool(_ANSWER_LINE.search(completion)))


def code(prompt: str, completion: str, tests: str | None = None, entry_point: str | None = None, **_) -> float:
    if not tests:
        return 0.0
    tests = "\n".join(tests) if isinstance(tests, list) else tests  # MBPP's test_list
    # the sandbox's interpreter: this process's may be one the sandbox user cannot run (a venv under /root)
    return float(check_completion("", code_program(prompt, completion), tests, entry_point, timeout=10.0,
                                  python=default_python()).passed)


def tests_passed(prompt: str, completion: str, tests: str | list[str] | None = None, entry_point: str | None = None,
                 **_) -> float:
    """The share of the record's tests the completion passes (a partial reward; `code` is all or nothing)."""
    if not tests:
        return 0.0
    passed, total = count_passed(prompt, completion, tests, entry_point, timeout=10.0, python=default_python())
    return passed / total


SHIPPED: dict[str, RewardFn] = {"exact_match": exact_match, "exact_match_strict": exact_match,
                                "exact_match_lenient": exact_match_lenient, "format_answer": format_answer,
                                "code": code, "tests_passed": tests_passed}


@dataclass
class Reward:
    name: str
    fn: RewardFn
    weight: float = 1.0


def load_reward(spec: str) -> RewardFn:
    """A shipped reward by name, `rm:PATH` (a reward model), or `module:function`; ConfigError naming what is wrong."""
    if spec in ("code", "tests_passed"):
        default_python()  # no interpreter the sandbox can run: say so now, not as a failure of every call
    if spec in SHIPPED:
        return SHIPPED[spec]
    if spec.startswith("rm:"):
        return RewardModelScorer(spec[3:])
    if spec.startswith("prm:"):  # a process reward model: the solution's lowest step score
        return ProcessRewardScorer(spec[4:])
    if ":" not in spec:
        raise ConfigError(f"reward {spec!r}: expected a shipped reward ({', '.join(SHIPPED)}) or module:function"
                          f"{did_you_mean(spec, SHIPPED)}", key="rewards")
    module_name, func_name = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"reward {spec!r}: cannot import {module_name!r} ({e})", key="rewards") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ConfigError(f"reward {spec!r}: {module_name} has no function {func_name!r}", key="rewards")
    return fn


def load_rewards(specs: list[str], weights: list[float] | None = None) -> list[Reward]:
    if not specs:
        raise ConfigError("no reward given: name at least one (e.g. exact_match)", key="rewards")
    weights = list(weights or [1.0] * len(specs))
    if len(weights) != len(specs):
        raise ConfigError(f"{len(weights)} reward weights for {len(specs)} rewards", key="reward_weights")
    return [Reward(s, load_reward(s), float(w)) for s, w in zip(specs, weights)]


RESERVED = ("prompt", "completion", "messages")  # the call's own arguments: never passed from a record's fields


@dataclass
class Scored:
    total: float  # the weighted sum; a failed reward counts 0
    parts: dict[str, float]  # each reward's value
    errors: dict[str, str] = field(default_factory=dict)  # reward name -> why it failed on this completion


def _failure(e: BaseException) -> str:
    if isinstance(e, SystemExit):
        return f"SystemExit: the reward called sys.exit({e.code!r})"
    return f"{type(e).__name__}: {e}"


def score_each(rewards: list[Reward], prompt: str, completion: str, fields: dict,
               messages: list[dict] | None = None) -> Scored:
    """Every reward's value of one completion and which failed. `messages`: a chat prompt's whole
    conversation, given to the rewards that read it (a reward model: `wants_messages = True`); the
    others see the last user message as `prompt`."""
    kwargs = {k: v for k, v in fields.items() if k not in RESERVED}
    parts, errors = {}, {}
    for r in rewards:
        try:
            extra = {"messages": messages} if messages is not None and getattr(r.fn, "wants_messages", False) else {}
            value = float(r.fn(prompt, completion, **kwargs, **extra))
            if not math.isfinite(value):
                raise ValueError(f"returned {value}")
        # a user's reward may raise anything, or call sys.exit: one sample pays, not the run (Ctrl-C still stops it)
        except (Exception, SystemExit) as e:  # noqa: BLE001
            value = 0.0
            errors[r.name] = _failure(e)
        parts[r.name] = value
    return Scored(sum(r.weight * parts[r.name] for r in rewards), parts, errors)


def score(rewards: list[Reward], prompt: str, completion: str, fields: dict,
          messages: list[dict] | None = None) -> tuple[float, dict[str, float], str | None]:
    """(weighted total, each reward's value, the first failure as "name: reason" or None); see score_each."""
    s = score_each(rewards, prompt, completion, fields, messages)
    name = next(iter(s.errors), None)
    return s.total, s.parts, (f"{name}: {s.errors[name]}" if name else None)


def parse_reward_args(args: list[str]) -> tuple[list[str], list[float]]:
    """`NAME[=WEIGHT]` command-line rewards as (names, weights); `rm:PATH` and `prm:PATH` may themselves hold "="."""
    names, weights = [], []
    for a in args:
        name, sep, weight = a.rpartition("=") if "=" in a and not a.startswith(("rm:", "prm:")) else (a, "", "")
        try:
            weights.append(float(weight) if sep else 1.0)
        except ValueError:
            raise ConfigError(f"--reward {a!r}: expected NAME or NAME=WEIGHT with a number", key="rewards") from None
        names.append(name)
    return names, weights
