"""What `groundup eval` writes and prints: results.json, results.md, per-item records, a table.

    OUT/results.json        {"version", "model", "settings", "tasks", "aggregate", "bpb", "environment", ...}
    OUT/results.md          the same as tables
    OUT/items/<task>.jsonl  one line per item: id, gold and log-likelihoods with each metric's 0/1, or id, target
                            (the gold answer; code: the tests), outputs and checks
    results.md also has a legend of the metrics, naming those lm-eval's definition of a task does not report

results.json keys:
- `version` (1), `created` (UTC ISO time), `seconds` (wall clock), `command` (argv)
- `model`: {path, model_dir, weights_digest (xxh3-128 of model.safetensors, as checkpoints record it),
  params, vocab_size, max_seq_len, dtype, device, tokenizer_hash, tokenizer_backend, prefix_ids}
- `settings`: EvalSettings (limit, num_fewshot, batch_size, fewshot_seed, bootstrap_iters, samples, ks, ...)
- `tasks.<name>`: {kind, metrics: {metric: {value, stderr}}, lm_eval_metrics (the metrics lm-eval
  reports for it), items, scored, failed, failures [{id, reason}], truncated, truncation (a
  sentence), num_fewshot, random_baseline, split, source, data_hash (sha256 of its data files),
  notes (where its data differs from lm-eval's), skipped_records, settings, seconds, items_per_s,
  model_digest, tokenizer_hash}
- `aggregate`: {name, value, rule, tasks: {name: {metric, value, random_baseline, centered}}} or null
- `bpb.<path>`: {kind, loss, bpb, tokens, bytes, domains: {name: {loss, bpb, tokens, bytes}}}

The output directory follows the rule of every groundup writer: an existing non-empty directory is
refused unless `overwrite`, and the new one is built under a temporary name and renamed into place
when complete (groundup.io.atomic_dir), so a crash never leaves half a result.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from groundup.benchmarks import task_names
from groundup.io import atomic_dir, atomic_write_json, atomic_write_text
from groundup.layout import claim_output_dir, mark_output_dir

RESULTS_FILE = "results.json"
ITEMS_DIR = "items"
# results.md's legend: what each metric is (pass@k and exact_match,<filter> by their first part)
METRIC_LEGEND = {
    "acc": "share of items whose most likely choice (summed log-likelihood) is the gold one; LAMBADA: every "
           "token of the last word is the model's greedy choice",
    "acc_norm": "acc with each choice's log-likelihood divided by its length in characters (lm-eval's acc_norm)",
    "acc_bytes": "acc with each choice's log-likelihood divided by its length in UTF-8 bytes (lm-eval's acc_bytes)",
    "perplexity": "exp(-mean log-likelihood of the last word); lower is better",
    "exact_match": "share of outputs whose answer equals the target (GSM8K strict-match: 'The answer is N.'; "
                   "flexible-extract: the last number in the output; custom tasks: the whole stripped output)",
    "pass@k": "chance that at least one of k samples passes the tests (the unbiased estimator from all samples)",
}


def _clean(value):
    """JSON has no NaN: non-finite numbers become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_results(out: str | Path, results: dict, records: dict[str, list[dict]] | None = None,
                  overwrite: bool = False, name: str = "results", markdown: str | None = None,
                  verb: str = "eval") -> Path:
    """OUT/<name>.json, OUT/<name>.md (`markdown`, or the evaluation tables) and OUT/items/<task>.jsonl;
    `verb` (eval, eval contamination) is recorded as the folder's maker."""
    out = claim_output_dir(out, verb, overwrite=overwrite)
    with atomic_dir(out) as tmp:
        mark_output_dir(tmp, verb)
        atomic_write_json(tmp / f"{name}.json", _clean(results))
        atomic_write_text(tmp / f"{name}.md", render_markdown(results) if markdown is None else markdown)
        for task, rows in (records or {}).items():
            lines = "".join(json.dumps(_clean(r), ensure_ascii=False) + "\n" for r in rows)
            atomic_write_text(tmp / ITEMS_DIR / f"{task}.jsonl", lines)
    return out


def _fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}g}" if abs(value) >= 1e5 else f"{value:.{digits}f}"


def table_rows(results: dict) -> list[tuple[str, str, str, str, str]]:
    """(task, metric, value, stderr, items) rows in task order; the aggregate last."""
    rows = []
    for name, r in results.get("tasks", {}).items():
        items = f"{r['scored']}/{r['items']}" if r["failed"] else str(r["items"])
        for i, (metric, m) in enumerate(r["metrics"].items()):
            rows.append((name if i == 0 else "", metric, _fmt(m["value"]), _fmt(m.get("stderr")),
                         items if i == 0 else ""))
    agg = results.get("aggregate")
    if agg:
        rows.append((f"aggregate ({len(agg['tasks'])} tasks)", "centered acc", _fmt(agg["value"]), "-", ""))
    for path, b in (results.get("bpb") or {}).items():
        rows.append((f"bpb {path}", "bits/byte", _fmt(b["bpb"]), "-", f"{b['tokens']:,} tok"))
        for domain, d in b.get("domains", {}).items():
            rows.append((f"  {domain}", "bits/byte", _fmt(d["bpb"]), "-", f"{d['tokens']:,} tok"))
    return rows


def render_table(results: dict) -> str:
    rows = [("task", "metric", "value", "stderr", "items"), *table_rows(results)]
    widths = [max(len(r[k]) for r in rows) for k in range(5)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if k < 2 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown(results: dict) -> str:
    model = results.get("model", {})
    lines = ["# Evaluation", "", f"Model: `{model.get('path', '?')}` ({model.get('params', 0):,} parameters, "
             f"context {model.get('max_seq_len', '?')}, weights {model.get('weights_digest', '?')}).", ""]
    if results.get("tasks") or results.get("bpb"):
        lines += ["| task | metric | value | stderr | items |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {' | '.join(r)} |" for r in table_rows(results)]
        lines.append("")
    notes = []
    for name, r in results.get("tasks", {}).items():
        if r["failed"]:
            shown = "; ".join(f"{f['id']}: {f['reason']}" for f in r["failures"][:3])
            notes.append(f"- {name}: {r['failed']} item(s) could not be scored ({shown})")
        if r["truncated"]:
            notes.append(f"- {name}: {r['truncation']}")
        if r.get("notes"):
            notes.append(f"- {name} data: {r['notes']}")
    if notes:
        lines += ["## Notes", "", *notes, ""]
    lines += metric_legend(results.get("tasks", {}))
    settings = results.get("settings", {})
    if settings:
        lines += ["## Settings", "", "```json", json.dumps(_clean(settings), indent=2), "```", ""]
    return "\n".join(lines)


def _metric_kind(metric: str) -> str:
    base = metric.split(",")[0]
    return "pass@k" if base.startswith(("pass@", "pass_at_")) else base


def metric_legend(tasks: dict) -> list[str]:
    """results.md's "Metrics" section: each metric shown, and which of them lm-eval's definition of a built-in
    task does not report (lm-eval computes acc_norm and acc_bytes whenever a task's metric_list names them;
    `groundup eval --export-lm-eval` names them, so lm-eval reproduces them as well)."""
    shown = dict.fromkeys(_metric_kind(m) for r in tasks.values() for m in r["metrics"])
    if not shown:
        return []
    lines = ["## Metrics", "", *[f"- {m}: {METRIC_LEGEND[m]}" for m in shown if m in METRIC_LEGEND]]
    builtin = set(task_names())
    extra = {}
    for name, r in tasks.items():
        if name in builtin and r.get("lm_eval_metrics"):
            theirs = {_metric_kind(m) for m in r["lm_eval_metrics"]} | {m.split(",")[0] for m in r["lm_eval_metrics"]}
            mine = [m for m in r["metrics"] if m.split(",")[0] not in theirs and _metric_kind(m) not in theirs]
            if mine:
                extra[name] = mine
    if extra:
        lines += ["", "Not in lm-eval's definition of the task (lm-eval computes them when the task's metric_list "
                  "names them; the task files `groundup eval --export-lm-eval` writes name them, so lm-eval "
                  "reproduces them): " + "; ".join(f"{t}: {', '.join(ms)}" for t, ms in extra.items()) + "."]
    if "winogrande" in tasks:
        lines += ["", "winogrande reports acc alone, as lm-eval does: each option fills its own context and the "
                  "same rest of the sentence is scored after each, so there is no choice length to normalise by."]
    return [*lines, ""]
