"""What `data annotate` counted and how well its classifier agrees with the judge: report.json and report.md.

report.json keys:
- `settings`: what defines the annotations (inputs, model, rubric_sha256, verdict, seed, sample, max_chars,
  temperature, max_tokens) plus the endpoint (without credentials), api_key_env (the variable's name, never
  its value), threshold and held_out
- `read`: ReadStats of the inputs (readers.py)
- `sample`: {documents (drawn), held_out, empty_skipped, duplicate_ids_in_sample}
- `this_run`: {already_annotated (skipped), sent, scored, unparsable, failed (after every retry: pending,
  tried again on the next run), requests, retries, timeouts, attempt_failures ({kind: attempts}: timeout,
  connection_error, http_NNN, rejected_NNN, fatal_NNN, bad_response, malformed_verdict), unparsable_examples,
  failed_examples, stopped (why the run ended early, or null), elapsed_s}
- `folder`: {annotated, scored, unparsable, pending (in the sample, not annotated yet), outside_sample,
  torn_lines_skipped, bad_lines, bad_line_examples, duplicate_lines, score_histogram ({"0".."5": documents})}
- `classifier`: {file, trained, threshold, train_positive, train_negative, reason (when not trained),
  held_out: {docs, positive, accuracy, precision, recall, f1, auc, spearman, pearson, confusion,
  mean_probability_by_score}}
  The classifier's decision is probability >= 0.5 against the judge's score >= threshold; AUC, Spearman and
  Pearson compare its probability with the judge's score. A value that is undefined (one class only) is null.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from groundup.data.annotate_client import MAX_SCORE, Outcome
from groundup.data.classifier import auc
from groundup.io import atomic_write_json, atomic_write_text

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
MAX_EXAMPLES = 10


@dataclasses.dataclass
class RunCounts:
    empty_skipped: int = 0  # input records with blank text, never sampled
    duplicate_ids_in_sample: int = 0  # a second record with a sampled (source, id)
    already_annotated: int = 0
    torn_lines: int = 0  # a last line cut by a kill, dropped on resume
    bad_lines: int = 0
    bad_line_examples: list[str] = dataclasses.field(default_factory=list)
    duplicate_lines: int = 0
    sent: int = 0  # documents with at least one request this run
    scored: int = 0
    unparsable: int = 0
    failed: int = 0
    requests: int = 0
    retries: int = 0
    attempt_failures: dict[str, int] = dataclasses.field(default_factory=dict)
    unparsable_examples: list[str] = dataclasses.field(default_factory=list)
    failed_examples: list[str] = dataclasses.field(default_factory=list)
    stopped: str = ""
    elapsed_s: float = 0.0

    def note_bad_line(self, where: str) -> None:
        self.bad_lines += 1
        if len(self.bad_line_examples) < MAX_EXAMPLES:
            self.bad_line_examples.append(f"{where}: not an annotation, skipped")

    def add(self, doc, outcome: Outcome) -> None:
        """Count one document's outcome (`doc`: an annotate.Document)."""
        self.sent += outcome.attempts > 0
        self.requests += outcome.attempts
        self.retries += max(0, outcome.attempts - 1)
        for kind in outcome.events:
            self.attempt_failures[kind] = self.attempt_failures.get(kind, 0) + 1
        where = f"{doc.source}/{doc.id}: {outcome.error} (after {outcome.attempts} attempts)"
        if outcome.status == "scored":
            self.scored += 1
        elif outcome.status == "unparsable":
            self.unparsable += 1
            if len(self.unparsable_examples) < MAX_EXAMPLES:
                self.unparsable_examples.append(where)
        elif outcome.status == "failed":
            self.failed += 1
            if len(self.failed_examples) < MAX_EXAMPLES:
                self.failed_examples.append(where)

    def report(self, docs: Sequence, done: dict[str, dict]) -> dict:
        """The `sample`, `this_run` and `folder` sections, for the sample `docs` and the annotations `done`."""
        mine = [done[d.key] for d in docs if d.key in done]
        histogram = {str(s): 0 for s in range(MAX_SCORE + 1)}
        for record in mine:
            if record["status"] == "scored":
                histogram[str(record["score"])] += 1
        scored = sum(histogram.values())
        run = {k: getattr(self, k) for k in ("already_annotated", "sent", "scored", "unparsable", "failed", "requests",
                                              "retries")}
        run.update(timeouts=self.attempt_failures.get("timeout", 0), attempt_failures=dict(sorted(
            self.attempt_failures.items())), unparsable_examples=self.unparsable_examples,
                   failed_examples=self.failed_examples, stopped=self.stopped or None,
                   elapsed_s=round(self.elapsed_s, 3))
        return {"sample": {"documents": len(docs), "held_out": sum(d.held_out for d in docs),
                           "empty_skipped": self.empty_skipped,
                           "duplicate_ids_in_sample": self.duplicate_ids_in_sample},
                "this_run": run,
                "folder": {"annotated": len(mine), "scored": scored, "unparsable": len(mine) - scored,
                           "pending": len(docs) - len(mine), "outside_sample": len(done) - len(mine),
                           "torn_lines_skipped": self.torn_lines, "bad_lines": self.bad_lines,
                           "bad_line_examples": self.bad_line_examples, "duplicate_lines": self.duplicate_lines,
                           "score_histogram": histogram}}


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank (scipy.stats.rankdata's default)."""
    order = np.argsort(x, kind="mergesort")
    _, first, counts = np.unique(x[order], return_index=True, return_counts=True)
    out = np.empty(len(x))
    out[order] = np.repeat(first + (counts + 1) / 2.0, counts)
    return out


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r; nan when either side is constant or has fewer than two values."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson's r of the average ranks (scipy.stats.spearmanr)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return pearson(ranks(x), ranks(y)) if len(x) >= 2 else float("nan")


def _finite(value: float) -> float | None:
    return None if value is None or math.isnan(value) else round(float(value), 6)


def evaluate_classifier(probabilities: Sequence[float], scores: Sequence[int], threshold: int) -> dict:
    """The classifier's agreement with the judge on held-out documents (see the module docstring)."""
    p, s = np.asarray(probabilities, dtype=np.float64), np.asarray(scores, dtype=np.int64)
    if not len(s):
        return {"docs": 0}
    truth, said = s >= threshold, p >= 0.5
    tp, fp = int((said & truth).sum()), int((said & ~truth).sum())
    fn, tn = int((~said & truth).sum()), int((~said & ~truth).sum())
    precision = tp / (tp + fp) if tp + fp else float("nan")
    recall = tp / (tp + fn) if tp + fn else float("nan")
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan")
    return {"docs": int(len(s)), "positive": int(truth.sum()), "accuracy": _finite(float((said == truth).mean())),
            "precision": _finite(precision), "recall": _finite(recall), "f1": _finite(f1),
            "auc": _finite(auc(truth.astype(np.int64), p)), "spearman": _finite(spearman(p, s)),
            "pearson": _finite(pearson(p, s)), "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn},
            "mean_probability_by_score": {str(k): _finite(float(p[s == k].mean()))
                                          for k in range(MAX_SCORE + 1) if (s == k).any()}}


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def markdown(report: dict) -> str:
    st, run, folder, clf = report["settings"], report["this_run"], report["folder"], report["classifier"]
    lines = [f"# Annotation: {st['model']} at {st['endpoint']}", ""]
    if run["stopped"]:
        lines += [f"**The run stopped early:** {run['stopped']}. Run the same command again to go on.", ""]
    rows = [(f"sample (seed {st['seed']})", report["sample"]["documents"]),
            ("annotated before this run", run["already_annotated"]), ("sent this run", run["sent"]),
            ("scored", run["scored"]), ("unparsable after retries", run["unparsable"]),
            ("failed after retries (tried again next run)", run["failed"]), ("requests", run["requests"]),
            ("retries", run["retries"]), ("timeouts", run["timeouts"]), ("in the folder: scored", folder["scored"]),
            ("in the folder: unparsable", folder["unparsable"]), ("pending", folder["pending"])]
    lines += ["| | documents |", "|---|---:|", *(f"| {name} | {n:,} |" for name, n in rows), ""]
    if run["attempt_failures"]:
        kinds = ", ".join(f"{k} {v:,}" for k, v in run["attempt_failures"].items())
        lines += [f"Failed attempts by kind: {kinds}", ""]
    if folder["torn_lines_skipped"] or folder["bad_lines"]:
        lines += [f"Torn last lines dropped: {folder['torn_lines_skipped']}; lines that are not annotations: "
                  f"{folder['bad_lines']}", ""]
    for title, key in (("Unparsable", "unparsable_examples"), ("Failed", "failed_examples")):
        if run[key]:
            lines += [f"{title} (first {len(run[key])}):", "", *(f"- {e}" for e in run[key]), ""]
    hist = folder["score_histogram"]
    lines += ["## Scores", "", "| score | " + " | ".join(hist) + " |", "|---" * (len(hist) + 1) + "|",
              "| documents | " + " | ".join(f"{v:,}" for v in hist.values()) + " |", ""]
    lines += ["## Classifier", ""]
    if not clf["trained"]:
        lines += [clf["reason"], ""]
        return "\n".join(lines)
    held = clf["held_out"]
    lines += [f"`{clf['file']}` (for `data curate` as classifier.model), trained on {clf['train_positive']:,} "
              f"documents scored {clf['threshold']} or more and {clf['train_negative']:,} below.", ""]
    if not held["docs"]:
        lines += ["No held-out documents (held_out = 0): agreement not measured.", ""]
        return "\n".join(lines)
    c = held["confusion"]
    names = {"accuracy": "accuracy", "precision": "precision", "recall": "recall", "f1": "F1", "auc": "AUC",
             "spearman": "Spearman", "pearson": "Pearson"}
    lines += [f"Agreement with {held['docs']:,} held-out annotations ({held['positive']:,} scored "
              f"{clf['threshold']} or more):", "", "| " + " | ".join(names.values()) + " |", "|---:" * len(names) + "|",
              "| " + " | ".join(_number(held[k]) for k in names) + " |", "",
              f"Confusion (classifier vs judge): {c['tp']} true positive, {c['fp']} false positive, {c['fn']} false "
              f"negative, {c['tn']} true negative.", ""]
    return "\n".join(lines)


def write_report(out: Path, report: dict) -> None:
    atomic_write_json(out / REPORT_JSON, report)
    atomic_write_text(out / REPORT_MD, markdown(report))
