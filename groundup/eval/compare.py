"""`groundup eval --compare A B`: each task's difference between two evaluations, and whether it is noise.

    report = compare_runs(load_run("eval/base"), load_run("eval/sft"), CompareSettings())
    print(render_compare(report))          # task, metric, A, B, diff, 95% CI, p-value, verdict

A and B are `groundup eval --out` folders, or their results.json (items/<task>.jsonl beside it). The two are
compared item by item: the records of each task common to both are matched by item id, and a task whose item
sets differ (another --limit, other data, another few-shot count) is refused by name, since its numbers are
not of the same questions. Per metric, over the items scored in both runs:

- 0/1 metrics (acc, acc_norm, acc_bytes, exact_match, pass@k with one sample): McNemar's test on the discordant
  pairs, b items right only in A and c right only in B. With b + c < `exact_below` (25) the exact binomial test,
  p = P(|X - n/2| >= |b - n/2|) for X ~ Binomial(b + c, 1/2) (scipy.stats.binomtest); else the chi-square
  statistic with continuity correction, (|b - c| - 1)^2 / (b + c), on one degree of freedom (as statsmodels'
  mcnemar computes both).
- Other metrics (perplexity, pass@k from several samples): a paired bootstrap. Items are resampled with
  replacement, the same indices for A and B, `resamples` times (10,000, seeded); p is the share of resampled
  differences at least as far from the observed one as the observed one is from zero (the bootstrap
  distribution shifted to the null, plus one in numerator and denominator).

Every difference (A - B) gets the paired bootstrap's percentile interval at 1 - alpha (scipy.stats.bootstrap,
paired). The verdict: p < alpha and the difference favours A ("A better"; lower is better for perplexity) or
B ("B better"); otherwise "within noise". Items that failed in either run are left out and counted.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from groundup.config import fail
from groundup.errors import DataError
from groundup.eval.metrics import pass_at_k
from groundup.eval.results import ITEMS_DIR, RESULTS_FILE, _clean
from groundup.io import atomic_dir, atomic_write_json, atomic_write_text
from groundup.layout import claim_output_dir, mark_output_dir

VERB = "eval --compare"
LOWER_IS_BETTER = {"perplexity"}
GSM8K_FILTERS = {"strict-match": "exact_match_strict", "flexible-extract": "exact_match_flexible"}


@dataclass
class CompareSettings:
    resamples: int = 10_000  # paired bootstrap resamples (every interval; the p-value of non-0/1 metrics)
    seed: int = 1234  # the bootstrap's seed: the same seed, the same intervals and p-values
    alpha: float = 0.05  # p below it is a verdict, else "within noise"; the intervals are at 1 - alpha
    exact_below: int = 25  # McNemar: exact binomial test below this many discordant pairs, else chi-square

    def validate(self) -> None:
        if self.resamples < 100:
            fail("resamples", self.resamples, "at least 100")
        if not 0 < self.alpha < 1:
            fail("alpha", self.alpha, "a probability in (0, 1)")
        if self.exact_below < 0:
            fail("exact_below", self.exact_below, "an integer >= 0 (0: always chi-square)")


@dataclass
class Run:
    """One `groundup eval` output: its results.json and where its items/<task>.jsonl live."""

    path: Path
    results: dict
    items_dir: Path

    def records(self, task: str) -> list[dict]:
        path = self.items_dir / f"{task}.jsonl"
        if not path.is_file():
            raise DataError(f"task {task}: {path} is missing; --compare pairs items, so it needs the items/ folder "
                            "that `groundup eval --out` writes beside results.json")
        rows = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    row = json.loads(line)
                    row["id"]
                except (json.JSONDecodeError, TypeError, KeyError) as e:
                    raise DataError(f"{path}:{lineno}: not an item record with an id ({e})") from None
                rows.append(row)
        return rows


def load_run(path: str | Path) -> Run:
    """A `groundup eval --out` folder, or its results.json."""
    path = Path(path)
    file = path / RESULTS_FILE if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"--compare {path}: no {RESULTS_FILE} there (give a `groundup eval --out` folder or its "
                        f"{RESULTS_FILE})")
    try:
        results = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{file}: not readable as JSON ({e})") from None
    if not isinstance(results, dict) or not isinstance(results.get("tasks"), dict):
        raise DataError(f"{file}: not a `groundup eval` results file (no 'tasks')")
    return Run(path, results, file.parent / ITEMS_DIR)


def item_value(metric: str, rec: dict) -> float | None:
    """One item's value of `metric` from its record (None: not scored, or the record does not say)."""
    if rec.get("error"):
        return None
    if metric == "perplexity":
        lls = rec.get("lls")
        return float(lls[0]) if lls else None
    if metric.startswith("exact_match,"):
        metric = GSM8K_FILTERS.get(metric.split(",", 1)[1], metric)
    if metric.startswith("pass@") and isinstance(rec.get("passed"), list):
        passed = rec["passed"]
        k = int(metric[len("pass@"):])
        return pass_at_k(len(passed), sum(bool(p) for p in passed), k) if 1 <= k <= len(passed) else None
    value = rec.get(metric)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def statistic(metric: str):
    """The task-level number of `metric` from per-item values, along `axis` (vectorised for the bootstrap)."""
    if metric == "perplexity":
        return lambda x, axis=-1: np.exp(-np.mean(x, axis=axis))
    return lambda x, axis=-1: np.mean(x, axis=axis)


def mcnemar(b: int, c: int, exact_below: int = 25) -> tuple[float, str]:
    """McNemar's two-sided p-value for b and c discordant pairs, and which test gave it."""
    from scipy.stats import binomtest, chi2

    n = b + c
    if n == 0:
        return 1.0, "mcnemar exact"
    if n < exact_below:
        return float(binomtest(b, n, 0.5).pvalue), "mcnemar exact"
    return float(chi2.sf((abs(b - c) - 1) ** 2 / n, 1)), "mcnemar chi2"


def paired_bootstrap(a: np.ndarray, b: np.ndarray, stat, resamples: int = 10_000, seed: int = 1234,
                     level: float = 0.95) -> tuple[float, float, float]:
    """(low, high, p) of stat(a) - stat(b): the percentile interval at `level` and the two-sided p-value of the
    shifted bootstrap distribution (module docstring), items resampled in pairs."""
    from scipy.stats import bootstrap

    observed = float(stat(a) - stat(b))
    if len(a) < 2:
        return math.nan, math.nan, math.nan
    res = bootstrap((a, b), lambda x, y, axis=-1: stat(x, axis=axis) - stat(y, axis=axis), paired=True,
                    vectorized=True, method="percentile", n_resamples=resamples, confidence_level=level,
                    batch=max(1, min(resamples, (1 << 23) // len(a))), rng=np.random.default_rng(seed))
    far = np.abs(res.bootstrap_distribution - observed) >= abs(observed) - 1e-12 * max(1.0, abs(observed))
    p = (1 + int(far.sum())) / (resamples + 1)
    return float(res.confidence_interval.low), float(res.confidence_interval.high), min(1.0, p)


def _pair(task: str, a_rows: list[dict], b_rows: list[dict]) -> list[tuple[dict, dict]]:
    """Records matched by item id; the task is refused when the item sets differ."""
    by_id = []
    for label, rows in (("A", a_rows), ("B", b_rows)):
        index = {}
        for r in rows:
            if r["id"] in index:
                raise DataError(f"task {task}: item id {r['id']!r} occurs twice in {label}'s records")
            index[r["id"]] = r
        by_id.append(index)
    only_a = [i for i in by_id[0] if i not in by_id[1]]
    only_b = [i for i in by_id[1] if i not in by_id[0]]
    if only_a or only_b:
        raise DataError(f"task {task}: A and B scored different items ({len(by_id[0])} and {len(by_id[1])}; "
                        f"{len(only_a)} only in A{f', first {only_a[0]!r}' if only_a else ''}, {len(only_b)} only "
                        f"in B{f', first {only_b[0]!r}' if only_b else ''}): compare evaluations of the same "
                        "items (the same --limit)")
    return [(by_id[0][i], by_id[1][i]) for i in by_id[0]]


def _check_same_items(task: str, ra: dict, rb: dict) -> None:
    for key, what in (("data_hash", "data"), ("num_fewshot", "few-shot count")):
        if ra.get(key) is not None and rb.get(key) is not None and ra[key] != rb[key]:
            raise DataError(f"task {task}: A and B differ in {what} ({key} {ra[key]!r} and {rb[key]!r}): their "
                            "items are not the same questions")


def compare_metric(task: str, metric: str, pairs: list[tuple[dict, dict]], settings: CompareSettings) -> dict:
    values = [(item_value(metric, ra), item_value(metric, rb)) for ra, rb in pairs]
    kept = [(x, y) for x, y in values if x is not None and y is not None]
    a = np.array([x for x, _ in kept], dtype=np.float64)
    b = np.array([y for _, y in kept], dtype=np.float64)
    stat = statistic(metric)
    row = {"task": task, "metric": metric, "n": len(kept), "excluded": len(pairs) - len(kept),
           "higher_is_better": metric not in LOWER_IS_BETTER}
    if not kept:
        return {**row, "a": math.nan, "b": math.nan, "diff": math.nan, "ci": [math.nan, math.nan], "p": math.nan,
                "test": None, "verdict": "no paired items"}
    row.update(a=float(stat(a)), b=float(stat(b)))
    row["diff"] = row["a"] - row["b"]
    low, high, p_boot = paired_bootstrap(a, b, stat, settings.resamples, settings.seed, 1 - settings.alpha)
    row["ci"] = [low, high]
    binary = metric not in LOWER_IS_BETTER and bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    if binary:
        wins, losses = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
        row["p"], row["test"] = mcnemar(wins, losses, settings.exact_below)
        row["discordant"] = {"a_only": wins, "b_only": losses}
    else:
        row["p"], row["test"] = p_boot, "paired bootstrap"
    better_a = (row["diff"] > 0) == row["higher_is_better"]
    significant = row["p"] == row["p"] and row["p"] < settings.alpha and row["diff"] != 0
    row["verdict"] = ("A better" if better_a else "B better") if significant else "within noise"
    return row


def _side(run: Run) -> dict:
    model = run.results.get("model") or {}
    return {"path": str(run.path), "model": model.get("path"), "weights_digest": model.get("weights_digest")}


def compare_runs(a: Run, b: Run, settings: CompareSettings | None = None) -> dict:
    """{"a", "b", "settings", "rows": [one per task and metric], "notes"}: see the module docstring."""
    settings = settings or CompareSettings()
    settings.validate()
    ta, tb = a.results["tasks"], b.results["tasks"]
    common = [t for t in ta if t in tb]
    if not common:
        raise DataError(f"--compare: A and B have no task in common (A: {', '.join(ta) or 'none'}; "
                        f"B: {', '.join(tb) or 'none'})")
    notes = [f"{t}: only in {label}" for label, mine, other in (("A", ta, tb), ("B", tb, ta)) for t in mine
             if t not in other]
    rows = []
    for task in common:
        _check_same_items(task, ta[task], tb[task])
        pairs = _pair(task, a.records(task), b.records(task))
        for metric in [m for m in ta[task].get("metrics", {}) if m in tb[task].get("metrics", {})]:
            row = compare_metric(task, metric, pairs, settings)
            if row["n"] == 0:
                notes.append(f"{task} {metric}: no item scored in both runs has a per-item value of it")
            rows.append(row)
    return {"version": 1, "a": _side(a), "b": _side(b), "settings": dataclasses.asdict(settings), "rows": rows,
            "notes": notes}


def _num(x, digits: int = 4) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def _p(p) -> str:
    return "-" if p is None or p != p else (f"{p:.2e}" if p < 1e-4 else f"{p:.4f}")


def compare_table(report: dict) -> list[tuple[str, ...]]:
    level = f"{1 - report['settings']['alpha']:.0%} CI"
    rows = [("task", "metric", "A", "B", "diff", level, "p-value", "test", "n", "verdict")]
    for r in report["rows"]:
        lo, hi = r["ci"]
        rows.append((r["task"], r["metric"], _num(r["a"]), _num(r["b"]), _num(r["diff"]) if r["diff"] != r["diff"]
                     else f"{r['diff']:+.4f}", f"[{_num(lo)}, {_num(hi)}]", _p(r["p"]), r["test"] or "-",
                     str(r["n"]) + (f" (-{r['excluded']})" if r["excluded"] else ""), r["verdict"]))
    return rows


def render_compare(report: dict) -> str:
    rows = compare_table(report)
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = [f"A = {report['a']['path']}", f"B = {report['b']['path']}"]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if k in (0, 1, 7, 9) else c.rjust(w)
                               for k, (c, w) in enumerate(zip(r, widths))).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)


def render_compare_markdown(report: dict) -> str:
    rows = compare_table(report)
    s = report["settings"]
    lines = ["# Comparison", "", f"A: `{report['a']['path']}` (model `{report['a']['model']}`)",
             f"B: `{report['b']['path']}` (model `{report['b']['model']}`)", "",
             f"| {' | '.join(rows[0])} |", f"|{' --- |' * len(rows[0])}"]
    lines += [f"| {' | '.join(r)} |" for r in rows[1:]]
    lines += ["", f"diff = A - B. 0/1 metrics: McNemar's test on the items right in one run only (exact binomial "
              f"below {s['exact_below']} such items, else chi-square with continuity correction); other metrics: "
              f"a paired bootstrap ({s['resamples']:,} resamples, seed {s['seed']}). Intervals: the paired "
              f"bootstrap's percentiles. Verdict: p < {s['alpha']} in the better direction, else within noise. "
              "n: items scored in both runs (excluded: failed in either).", ""]
    if report["notes"]:
        lines += ["## Notes", "", *[f"- {n}" for n in report["notes"]], ""]
    return "\n".join(lines)


def write_compare(out: str | Path, report: dict, overwrite: bool = False) -> Path:
    """OUT/compare.json and OUT/compare.md, renamed into place when complete."""
    out = claim_output_dir(out, VERB, overwrite=overwrite)
    with atomic_dir(out) as tmp:
        mark_output_dir(tmp, VERB)
        atomic_write_json(tmp / "compare.json", _clean(report))
        atomic_write_text(tmp / "compare.md", render_compare_markdown(report))
    return out
