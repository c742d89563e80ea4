"""`evaluate`: a model and its tokenizer on benchmark tasks, scored as lm-evaluation-harness scores them.

    model, tok = load_for_inference("out/model")
    out = evaluate(model, tok, resolve_tasks("core,lambada,gsm8k"), EvalSettings(limit=100))
    out["tasks"]["arc_easy"]["metrics"]["acc_norm"]       # {"value": 0.27, "stderr": 0.044}
    out["aggregate"]                                        # the chance-centred mean over multiple-choice tasks
    out["records"]["arc_easy"][0]                           # one item: log-likelihoods, prediction, gold

The promise, per kind of task (task definitions: groundup/benchmarks):
- multiple_choice: every choice's log-likelihood (eval/scoring.py: lm-eval's tokenisation, each
  shared context once); acc, acc_norm (per character) and acc_bytes (per UTF-8 byte) as lm-eval's
  process_results (acc alone for Winogrande's partial scoring: `choice_metric_names`); standard errors
  lm-eval's `mean_stderr`.
- loglikelihood (LAMBADA): acc = every target token greedy (lm-eval's is_greedy); perplexity =
  exp(-mean log-likelihood) with lm-eval's bootstrap standard error.
- generate: eval/generation.py (GSM8K exact match per filter, HumanEval/MBPP pass@k, custom exact match);
  with tools (`EvalSettings.tools`, or a custom task's `tools`), through the tool loop, the final answer
  scored, and the result's `tools` holding the share of replies that called a tool and of calls that ran.
The aggregate is nanochat's CORE centring, (acc - random_baseline) / (1 - random_baseline) averaged
over the multiple-choice tasks run, using acc_norm where lm-eval reports it and acc otherwise.

Nothing is dropped silently: an item that cannot be scored (a continuation that encodes to no
tokens, one longer than the model's context, a non-finite log-likelihood, a failed generation) is
counted in `failed` with the reason and left out of the metrics (a NaN never counts as right); an item whose prompt was longer than the context is
left-truncated as lm-eval does and counted in `truncated`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Sequence

from groundup.errors import ConfigError
from groundup.eval.generation import EngineCompleter, ToolCompleter, run_generative
from groundup.eval.metrics import (bootstrap_stderr, centered, choice_metrics, core_metric, mean_stderr, perplexity,
                                   perplexity_of)
from groundup.eval.scoring import encode_requests, score_requests
from groundup.infer.engine import Generator
from groundup.tools import ToolRunner, resolve_tools

MC_METRICS = ("acc", "acc_norm", "acc_bytes")
GEN_METRICS = ("exact_match", "pass@1", "pass_at_1")
MAX_FAILURES_SHOWN = 20


@dataclass
class EvalSettings:
    limit: int | None = None  # first items of each task (mmlu: of each subject)
    num_fewshot: int | None = None  # None: each task's default (lm-eval's)
    batch_size: int = 32  # continuation rows per forward pass (log-likelihood tasks)
    gen_batch_size: int = 8  # prompts decoded together (generative tasks)
    fewshot_seed: int = 1234  # lm-eval's default few-shot seed
    bootstrap_iters: int = 100_000  # lm-eval's default; 0: no bootstrapped standard errors
    samples: int = 1  # generations per item (pass@k needs k <= samples)
    ks: tuple[int, ...] = (1,)
    temperature: float | None = None  # None: greedy for 1 sample, 0.8 for more
    max_gen_tokens: int | None = None  # None: each task's max_gen_toks (lm-eval's 256 by default)
    seed: int = 1234  # sampling seed
    sandbox_timeout: float = 10.0  # seconds per program
    workers: int | None = None  # sandbox processes (default: one per CPU)
    tools: str | None = None  # tools generative tasks call (calculator,python,module:function); None: a task's own
    max_tool_calls: int = 4  # with tools: calls per reply before the model must answer

    def validate(self) -> None:
        if self.max_tool_calls < 1:
            raise ConfigError(f"max_tool_calls = {self.max_tool_calls}: expected at least 1", key="max_tool_calls")
        for key in ("batch_size", "gen_batch_size", "samples"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} = {getattr(self, key)}: expected at least 1", key=key)
        if any(k < 1 for k in self.ks):
            raise ConfigError(f"k = {list(self.ks)}: expected integers >= 1", key="k")
        if self.bootstrap_iters < 0:
            raise ConfigError(f"bootstrap_iters = {self.bootstrap_iters}: expected >= 0", key="bootstrap_iters")
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature = {self.temperature}: expected a number >= 0 (0: greedy)", key="temperature")
        if self.max_gen_tokens is not None and self.max_gen_tokens < 1:
            raise ConfigError(f"max_gen_tokens = {self.max_gen_tokens}: expected at least 1", key="max_gen_tokens")
        if not (math.isfinite(self.sandbox_timeout) and self.sandbox_timeout > 0):
            raise ConfigError(f"sandbox_timeout = {self.sandbox_timeout}: expected a positive number of seconds",
                              key="sandbox_timeout")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers = {self.workers}: expected at least 1", key="workers")


def choice_metric_names(items) -> tuple[str, ...]:
    """What a multiple-choice task reports: acc, acc_norm, acc_bytes; acc alone when the choices fill their own
    contexts (Winogrande's partial scoring). There every choice scores the same continuation, so dividing its
    log-likelihood by the length of the choice in the context corrects for nothing (lm-eval's winogrande YAML
    lists acc only). acc_bytes, and acc_norm where a task's lm-eval YAML omits it, are computed as lm-eval's
    process_results computes them when a metric_list names them (results.md says which)."""
    return ("acc",) if any(len(item.contexts) > 1 for item in items) else MC_METRICS


def check_task_metrics(task) -> None:
    """A custom task asking for a metric this harness does not compute fails before any work."""
    known = MC_METRICS if task.kind == "multiple_choice" else GEN_METRICS if task.kind == "generate" else None
    if known is None:
        return
    unknown = [m for m in task.metrics if m not in known]
    if unknown:
        raise ConfigError(f"task {task.name}: metric {unknown[0]!r} is not computed for {task.kind} tasks "
                          f"(known: {', '.join(known)})", key="metric")


def _bar(progress: bool, total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=" req", disable=not progress, leave=False)


def _loglikelihood_task(model, tokenizer, task, items, settings: EvalSettings, progress: bool):
    requests, owner = [], []
    for i, item in enumerate(items):
        for r in item.requests():
            requests.append(r)
            owner.append(i)
    encoded = encode_requests(tokenizer, requests, model.cfg.max_seq_len)
    names = choice_metric_names(items) if task.kind == "multiple_choice" else ()
    per_item: list[list[int]] = [[] for _ in items]
    for k, i in enumerate(owner):
        per_item[i].append(k)
    t0 = time.perf_counter()
    with _bar(progress, len(requests), task.name) as bar:  # an item's choices share their common prefix
        scores = score_requests(model, encoded, settings.batch_size, groups=per_item, progress=bar.update,
                                greedy=task.kind != "multiple_choice")  # only LAMBADA's acc needs arg-max flags
    score_seconds = time.perf_counter() - t0
    records, failed = [], []
    for item, ks in zip(items, per_item):
        errors = [encoded[k].error for k in ks if encoded[k].error]
        if not errors and not all(math.isfinite(scores[k].logprob) for k in ks):  # NaN never picks a winner
            errors = [f"non-finite log-likelihood ({', '.join(str(scores[k].logprob) for k in ks)}): the model's "
                      "outputs are NaN or infinite (corrupt weights, or an overflow in this dtype)"]
        rec = {"id": item.id, "gold": item.gold, "truncated": max(encoded[k].truncated for k in ks)}
        if errors:
            rec["error"] = errors[0]
            failed.append({"id": item.id, "reason": errors[0]})
        else:
            rec.update(lls=[scores[k].logprob for k in ks], tokens=[scores[k].tokens for k in ks])
            if task.kind != "multiple_choice":
                rec["greedy"] = [scores[k].greedy for k in ks]
            if task.kind == "multiple_choice":
                choices = item.choices or [c[1:] if c.startswith(" ") else c for c in item.continuations]
                rec.update({k: v for k, v in choice_metrics(rec["lls"], choices, item.gold).items() if k in names})
            else:
                rec["acc"] = float(all(rec["greedy"]))
        records.append(rec)
    ok = [r for r in records if "error" not in r]
    metrics = {}
    if task.kind == "multiple_choice":
        for name in names:
            values = [r[name] for r in ok]
            metrics[name] = {"value": sum(values) / len(values) if values else float("nan"),
                             "stderr": mean_stderr(values)}
    else:
        lls = [r["lls"][0] for r in ok]
        accs = [r["acc"] for r in ok]
        se = bootstrap_stderr(perplexity_of, lls, settings.bootstrap_iters) if settings.bootstrap_iters else None
        metrics["perplexity"] = {"value": perplexity(lls), "stderr": se}
        metrics["acc"] = {"value": sum(accs) / len(accs) if accs else float("nan"), "stderr": mean_stderr(accs)}
    truncated = sum(1 for r in records if r["truncated"])
    return metrics, records, failed, truncated, {"batch_size": settings.batch_size, "requests": len(requests),
                                                 "score_seconds": round(score_seconds, 3)}


def _generate_task(model, tokenizer, task, items, settings: EvalSettings, progress: bool, completer):
    n = len(items) * settings.samples
    tools = settings.tools or task.tools
    with _bar(progress, n, task.name) as bar:
        if completer is None and tools:
            completer = ToolCompleter(Generator(model, tokenizer), ToolRunner(resolve_tools(tools)),
                                      settings.max_tool_calls, settings.gen_batch_size, progress=bar.update)
        elif completer is None:
            completer = EngineCompleter(Generator(model, tokenizer), settings.gen_batch_size, progress=bar.update)
        out = run_generative(task, items, completer, samples=settings.samples, ks=settings.ks,
                             temperature=settings.temperature, max_new_tokens=settings.max_gen_tokens,
                             seed=settings.seed, sandbox_timeout=settings.sandbox_timeout, workers=settings.workers)
    extra = out["settings"] if out["tools"] is None else {**out["settings"], "tools": out["tools"]}
    return out["metrics"], out["records"], out["failed"], out["truncated"], extra


def evaluate_task(model, tokenizer, task, settings: EvalSettings, progress: bool = True, completer=None) -> dict:
    """One task's result (see `evaluate`) and its per-item records under "records"."""
    check_task_metrics(task)
    start = time.perf_counter()
    items = task.items(limit=settings.limit, num_fewshot=settings.num_fewshot, seed=settings.fewshot_seed)
    if task.kind == "generate":
        metrics, records, failed, truncated, extra = _generate_task(model, tokenizer, task, items, settings,
                                                                    progress, completer)
    else:
        metrics, records, failed, truncated, extra = _loglikelihood_task(model, tokenizer, task, items, settings,
                                                                         progress)
    seconds = time.perf_counter() - start
    shots = task.num_fewshot if settings.num_fewshot is None else settings.num_fewshot
    context = model.cfg.max_seq_len
    tools = extra.pop("tools", None)  # a run with tools: which, and the shares of replies and calls that used them
    return {
        "name": task.name, "kind": task.kind, "metrics": metrics, "lm_eval_metrics": list(task.metrics),
        "items": len(items), "scored": len(items) - len(failed), "failed": len(failed),
        "failures": failed[:MAX_FAILURES_SHOWN], "truncated": truncated,
        "truncation": _truncation(task, truncated, context, extra) if truncated else "",
        "num_fewshot": shots, "random_baseline": task.random_baseline, "split": task.split, "source": task.source,
        "data_hash": task.data_hash, "notes": task.notes, "skipped_records": list(task.skipped),
        "settings": {"limit": settings.limit, "num_fewshot": shots, "fewshot_seed": settings.fewshot_seed, **extra},
        "seconds": round(seconds, 3), "items_per_s": round(len(items) / seconds, 2) if seconds > 0 else None,
        **({"tools": tools} if tools is not None else {}), "records": records,
    }


def _truncation(task, truncated: int, context: int, extra: dict) -> str:
    if task.kind == "generate":
        return (f"{truncated} item(s) whose prompt plus {extra['max_new_tokens']} new tokens exceeds the model's "
                f"context of {context} tokens lost tokens from the start of the prompt (lm-eval's left truncation)")
    return (f"{truncated} item(s) longer than the model's context of {context} tokens lost tokens from the start "
            "of their context (lm-eval's left truncation: the last context + 1 tokens are kept)")


def aggregate(results: dict) -> dict | None:
    """The chance-centred mean over the multiple-choice tasks in `results` (None when there are none)."""
    parts = {}
    for name, r in results.items():
        if r["kind"] != "multiple_choice" or r["scored"] == 0:
            continue
        metric = core_metric(r["lm_eval_metrics"])
        value = r["metrics"][metric]["value"]
        parts[name] = {"metric": metric, "value": value, "random_baseline": r["random_baseline"],
                       "centered": centered(value, r["random_baseline"])}
    if not parts:
        return None
    return {"name": "centered_accuracy", "value": sum(p["centered"] for p in parts.values()) / len(parts),
            "rule": "mean over tasks of (acc - random_baseline) / (1 - random_baseline); acc_norm where lm-eval "
                    "reports it, else acc (nanochat's CORE centring)", "tasks": parts}


def evaluate(model, tokenizer, tasks: Sequence, settings: EvalSettings | None = None, progress: bool = True,
             completer=None, on_task=None) -> dict:
    """{"tasks": {name: result}, "records": {name: [item, ...]}, "aggregate", "settings"}; `on_task(result)`
    is called after each task (the CLI prints a line)."""
    settings = settings or EvalSettings()
    settings.validate()
    for task in tasks:
        check_task_metrics(task)
    results, records = {}, {}
    for task in tasks:
        result = evaluate_task(model, tokenizer, task, settings, progress, completer)
        records[task.name] = result.pop("records")
        results[task.name] = result
        if on_task is not None:
            on_task(result)
    return {"tasks": results, "records": records, "aggregate": aggregate(results),
            "settings": dataclasses.asdict(settings)}
