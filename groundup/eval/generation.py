"""Generative tasks: GSM8K exact match, HumanEval/MBPP pass@k in the sandbox, custom exact match.

    completer = EngineCompleter(Generator(model, tok), batch_size=8)
    result = run_generative(task, items, completer, samples=1, ks=[1])
    result["metrics"]   # {"exact_match,strict-match": {...}, "exact_match,flexible-extract": {...}} or {"pass@1": ...}

Generation goes through the engine (`Generator.complete_ids`) with each item's stop strings
(lm-eval's `until`; end of text stops too), greedy unless `samples` > 1 asks for sampling at
`temperature`. A prompt is the tokenizer's prefix then the prompt's ids; one too long for the
context loses its first tokens so that `max_new_tokens` fit (lm-eval's left truncation for
generation) and is counted. `max_new_tokens` defaults to the task's `max_gen_toks` (lm-eval's 256).

Scoring:
- GSM8K (tasks with strict/flexible filters): lm-eval's regex filters on the first sample, then
  exact_match with its options; the two filters are reported as separate metrics.
- Code (items with tests): HumanEval runs prompt + completion + "\\n" + tests (which end in
  `check(entry_point)`), MBPP completion + "\\n" + tests, as lm-eval's code_eval builds them; each
  program runs in `sandbox.run_many` with `sandbox.default_python()`; per item c of n samples
  pass, pass@k is the unbiased estimator (`metrics.pass_at_k`), averaged over items.
- Custom generative tasks: exact match of the stripped output and target.

With tools (`eval --tools calculator`, or a custom task's `tools` key), `ToolCompleter` sends each prompt as
a user message through the tool loop (infer/tool_loop.py) and the reply scored is the final answer, after
the calls; the result's `tools` says which tools ran and `replies_with_call` (the share of replies that
called a tool at least once) and `calls_ok` (the share of calls that parsed and ran without error).

The completer is any callable (tests pass a stub whose outputs they choose).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from groundup.benchmarks import exact_match, extract_flexible, extract_strict
from groundup.errors import GroundupError
from groundup.eval.metrics import mean_stderr, pass_at_k
from groundup.eval.scoring import prefix_ids
from groundup.infer.tool_loop import generate_with_tools
from groundup.sandbox.runner import default_python, run_many


@dataclass
class Generated:
    text: str
    truncated: int = 0  # prompt tokens dropped from the start
    error: str | None = None
    tool_calls: int | None = None  # with tools: calls the reply made (None: generated without tools)
    tool_errors: int = 0  # of those, calls that did not parse or run


class Completer(Protocol):
    def __call__(self, prompts: Sequence[str], *, stop: list[str], max_new_tokens: int, temperature: float,
                 seed: int) -> list[Generated]: ...


class EngineCompleter:
    """Completions from the generation engine, `batch_size` prompts decoded together."""

    def __init__(self, generator, batch_size: int = 8, progress: Callable[[int], None] | None = None):
        self.gen = generator
        self.batch_size = batch_size
        self.prefix = prefix_ids(generator.tokenizer)
        self.progress = progress

    def __call__(self, prompts, *, stop, max_new_tokens, temperature, seed) -> list[Generated]:
        context = self.gen.cfg.max_seq_len
        max_new_tokens = max(1, min(max_new_tokens, context - 1))
        rows = [self.prefix + ids for ids in self.gen.tokenizer.encode_batch(list(prompts))]
        out: list[Generated] = []
        for first in range(0, len(rows), self.batch_size):
            batch = rows[first: first + self.batch_size]
            cut = [max(0, len(r) + max_new_tokens - context) for r in batch]
            try:
                done = self.gen.complete_ids(batch, max_new_tokens=max_new_tokens, temperature=temperature,
                                             seed=seed + first, stop=list(stop), overflow="truncate")
                out += [Generated(c.text, k) for c, k in zip(done, cut)]
            except (GroundupError, ValueError, RuntimeError) as e:  # counted per item, never dropped
                out += [Generated("", k, error=f"generation failed: {e}") for k in cut]
            if self.progress is not None:
                self.progress(len(batch))
        return out


class ToolCompleter:
    """Completions through the tool loop: each prompt a user message, the final answer its text."""

    def __init__(self, generator, runner, max_tool_calls: int = 4, batch_size: int = 8,
                 progress: Callable[[int], None] | None = None):
        self.gen, self.runner, self.max_tool_calls = generator, runner, max_tool_calls
        self.batch_size, self.progress = batch_size, progress
        self.tools = [s["function"]["name"] for s in runner.schemas()]

    def __call__(self, prompts, *, stop, max_new_tokens, temperature, seed) -> list[Generated]:
        max_new_tokens = max(1, min(max_new_tokens, self.gen.cfg.max_seq_len - 1))
        out: list[Generated] = []
        for first in range(0, len(prompts), self.batch_size):
            batch = prompts[first: first + self.batch_size]
            calls, failed = [0] * len(batch), [0] * len(batch)  # per row: every call the loop took up, and failures

            def count(row: int, kind: str, payload) -> None:
                calls[row] += kind == "call"
                failed[row] += kind == "result" and not payload.ok

            try:
                done = generate_with_tools(self.gen, [[{"role": "user", "content": p}] for p in batch], self.runner,
                                           max_tool_calls=self.max_tool_calls, seed=seed + first, on_event=count,
                                           max_new_tokens=max_new_tokens, temperature=temperature, stop=list(stop))
                out += [Generated(r.text, tool_calls=n, tool_errors=e) for r, n, e in zip(done, calls, failed)]
            except (GroundupError, ValueError, RuntimeError) as e:  # counted per item, never dropped
                out += [Generated("", error=f"generation failed: {e}") for _ in batch]
            if self.progress is not None:
                self.progress(len(batch))
        return out


def tool_use(completer, outputs: Sequence[Generated]) -> dict | None:
    """The tools a run called and how: None when it ran without tools."""
    made = [o for o in outputs if o.tool_calls is not None and o.error is None]
    if not made and not hasattr(completer, "tools"):
        return None
    calls, errors = sum(o.tool_calls for o in made), sum(o.tool_errors for o in made)
    return {"tools": list(getattr(completer, "tools", [])),
            "max_tool_calls": getattr(completer, "max_tool_calls", None), "replies": len(made), "replies_with_call": sum(o.tool_calls > 0 for o in made) / len(made) if made else 0.0,
            "calls": calls, "failed_calls": errors, "calls_ok": (calls - errors) / calls if calls else None}


def _is_gsm8k(task) -> bool:
    return "strict-match" in task.filters or "flexible-extract" in task.filters


def _programs(item, completions: Sequence[str]) -> list[str]:
    head = item.prompt if item.entry_point is not None else ""
    return [head + c + "\n" + item.tests for c in completions]


def run_generative(task, items: Sequence, completer: Completer, *, samples: int = 1, ks: Sequence[int] = (1,),
                   temperature: float | None = None, max_new_tokens: int | None = None, seed: int = 1234,
                   sandbox_timeout: float = 10.0, workers: int | None = None) -> dict:
    """Generate for `items` of `task` and score them; returns {"metrics", "records", "failed", "truncated"}.

    `metrics` maps a name to {"value", "stderr"}; `records` has one dict per item (id, target, outputs,
    scores, error); `failed` lists {"id", "reason"} for items that could not be scored (counted, not dropped)."""
    if samples < 1:
        raise ValueError(f"samples = {samples}: expected at least 1")
    temperature = (0.0 if samples == 1 else 0.8) if temperature is None else temperature
    max_new = max_new_tokens or task.max_gen_toks or 256
    prompts, owners = [], []
    for i, item in enumerate(items):
        prompts += [item.prompt] * samples
        owners += [i] * samples
    outputs: list[Generated] = []
    by_stop: dict[tuple[str, ...], list[int]] = {}
    for k, i in enumerate(owners):
        by_stop.setdefault(tuple(items[i].stop), []).append(k)
    outputs = [Generated("")] * len(prompts)
    for stop, positions in by_stop.items():
        got = completer([prompts[k] for k in positions], stop=list(stop), max_new_tokens=max_new,
                        temperature=temperature, seed=seed)
        for k, g in zip(positions, got):
            outputs[k] = g
    per_item = [[outputs[k] for k in range(i * samples, (i + 1) * samples)] for i in range(len(items))]
    records, failed = [], []
    for item, outs in zip(items, per_item):
        error = next((o.error for o in outs if o.error), None)
        # the gold answer beside the output: the target (GSM8K's number, a custom task's answer), or for code
        # the tests the program must pass (lm-eval's doc_to_target for HumanEval and MBPP)
        records.append({"id": item.id, "target": item.target if item.tests is None else item.tests,
                        "outputs": [o.text for o in outs], "truncated": max(o.truncated for o in outs), "error": error})
        if outs[0].tool_calls is not None:
            records[-1].update(tool_calls=[o.tool_calls for o in outs], tool_errors=[o.tool_errors for o in outs])
        if error:
            failed.append({"id": item.id, "reason": error})
    ok = [r for r in records if r["error"] is None]
    ok_items = [item for item, r in zip(items, records) if r["error"] is None]
    if any(item.tests is not None for item in ok_items):
        metrics = _score_code(ok_items, ok, samples, ks, sandbox_timeout, workers)
    elif _is_gsm8k(task):
        metrics = _score_gsm8k(ok_items, ok)
    else:
        metrics = _score_exact(ok_items, ok)
    return {"metrics": metrics, "records": records, "failed": failed,
            "truncated": sum(1 for r in records if r["truncated"]), "tools": tool_use(completer, outputs),
            "settings": {"samples": samples, "temperature": temperature, "max_new_tokens": max_new,
                         "ks": [k for k in ks if k <= samples]}}


def _mean(values: list[float]) -> dict:
    return {"value": sum(values) / len(values) if values else float("nan"), "stderr": mean_stderr(values)}


def _score_gsm8k(items, records) -> dict:
    strict, flexible = [], []
    for item, r in zip(items, records):
        text = r["outputs"][0]
        r["strict"], r["flexible"] = extract_strict(text), extract_flexible(text)
        r["exact_match_strict"] = float(exact_match(r["strict"], item.target))
        r["exact_match_flexible"] = float(exact_match(r["flexible"], item.target))
        strict.append(r["exact_match_strict"])
        flexible.append(r["exact_match_flexible"])
    return {"exact_match,strict-match": _mean(strict), "exact_match,flexible-extract": _mean(flexible)}


def _score_exact(items, records) -> dict:
    values = []
    for item, r in zip(items, records):
        r["exact_match"] = float(r["outputs"][0].strip() == (item.target or "").strip())
        values.append(r["exact_match"])
    return {"exact_match": _mean(values)}


def _score_code(items, records, samples: int, ks: Sequence[int], timeout: float, workers: int | None) -> dict:
    python = default_python()
    programs = [p for item, r in zip(items, records) for p in _programs(item, r["outputs"])]
    results = run_many(programs, workers=workers, python=python, timeout=timeout)
    ks = [k for k in ks if k <= samples] or [1]
    per_k: dict[int, list[float]] = {k: [] for k in ks}
    for n, (item, r) in enumerate(zip(items, records)):
        mine = results[n * samples: (n + 1) * samples]
        r["passed"] = [res.passed for res in mine]
        r["status"] = [res.status + (f": {res.detail}" if res.detail else "") for res in mine]
        c = sum(r["passed"])
        for k in ks:
            per_k[k].append(pass_at_k(samples, c, k))
    return {f"pass@{k}": _mean(v) for k, v in per_k.items()}
