"""`report.md` for a demo directory or a training run directory, from the files the stages wrote.

Every section is optional: it appears when its input exists, so `groundup report RUN` works on a
plain `groundup train` run (config, metrics, plots, evaluations) as well as on a demo directory,
which adds the stage times and the budget, the curation table, tokenizer statistics, the held-out
works, the models table (one row per model), fine-tuning and alignment curves, conversations before
and after alignment, and sample generations.

Demo directory layout (see groundup/demo/run.py): stages.json, budget.json, curated/report.json,
tokenizer/, tokens/index.json, run/ (pretraining), models/, sft/, align/, scorecard/, samples.json.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from groundup.errors import CheckpointError, DataError
from groundup.io import atomic_write_text
from groundup.layout import (METRICS_FILE, SUMMARY_FILE, TOKENIZER_DIR, TOKENIZER_META_FILE, claim_output_dir,
                             is_model_dir, is_run_dir, resolve_model_dir)
from groundup.report.demo_sections import (arena_section, budget_section, conversations_section, heldout_section,
                                           plot_posttraining, posttraining_section, scorecard_section)
from groundup.report.plots import plot_training, read_metrics
from groundup.report.sections import (curation_section, model_section, samples_section, stages_section,
                                      tokenizer_section, training_section)

REPORT_FILE = "report.md"
PLOTS_DIR = "plots"


def _load(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except json.JSONDecodeError:
        return None


def _run_dir(root: Path) -> Path | None:
    """The training run inside a demo directory, or the directory itself if it is a run."""
    for candidate in (root, root / "run"):
        if (candidate / METRICS_FILE).is_file() or is_run_dir(candidate):
            return candidate
    return None


MARKER = "<!-- written by groundup report -->"  # a report.md without it belongs to someone else


def write_report(root: str | Path, title: str | None = None, overwrite: bool = False) -> Path:
    """Write ROOT/report.md and ROOT/plots/*.png for a demo or training run directory; returns the path.

    Any other directory is refused, and so is a report.md this function did not write (a curation
    report, a user's notes) unless `overwrite`."""
    root = claim_output_dir(root, "report")  # a training run's or a demo's folder, never another verb's
    run = _run_dir(root)
    if run is None and not (root / "stages.json").is_file():
        raise DataError(f"{root}: neither a training run (metrics.jsonl, checkpoints/) nor a demo directory: "
                        "nothing to report")
    path = root / REPORT_FILE
    if path.exists() and not overwrite and not _ours(path):
        raise DataError(f"{path} exists and was not written by 'groundup report'; move it away or pass --overwrite")
    parts = [MARKER, f"# {title or 'groundup report'}: {root.name}", "",
             f"Written {time.strftime('%Y-%m-%d %H:%M')} on {platform.machine()} "
             f"({platform.processor() or platform.system()}), Python {platform.python_version()}.", ""]
    stages = _load(root / "stages.json")
    if stages:
        parts += stages_section(stages)
        budget = _load(root / "budget.json")
        if budget:
            parts += budget_section(budget, stages)
    rows = _scorecard(root)
    if rows:
        parts += scorecard_section(list(rows.values()))
    curation = _load(root / "curated" / "report.json")
    if curation:
        parts += curation_section(curation)
    tok_meta = _load(root / TOKENIZER_DIR / TOKENIZER_META_FILE)
    shards = _load(root / "tokens" / "index.json")
    if tok_meta or shards:
        parts += tokenizer_section(tok_meta, shards)
    if shards:
        parts += heldout_section(shards)
    model_dir = root / "models" / "base" if is_model_dir(root / "models" / "base") else None
    if model_dir is None and run is not None:
        try:
            model_dir = resolve_model_dir(run, note=lambda _: None)
        except CheckpointError:
            model_dir = None
    if model_dir is not None:
        parts += model_section(model_dir)
    if run is not None:
        plots = plot_training(run / METRICS_FILE, root / PLOTS_DIR)
        train, evals, events = read_metrics(run / METRICS_FILE)
        parts += training_section(train, evals, events, {k: p.relative_to(root) for k, p in plots.items()},
                                  _load(run / SUMMARY_FILE))
    if run is not None and run != root:
        parts += posttraining_section(plot_posttraining(root / "sft" / METRICS_FILE, root / "align" / METRICS_FILE,
                                                        root / PLOTS_DIR), root)
    arena = _load(root / "arena" / "ratings.json")
    if arena:
        parts += arena_section(arena)
    parts += conversations_section(rows)
    samples = _load(root / "samples.json")
    if samples:
        parts += samples_section(samples)
    atomic_write_text(path, "\n".join(parts).rstrip() + "\n")
    return path


def _scorecard(root: Path) -> dict[str, dict]:
    """The demo's report-card rows by model name (OUT/scorecard/*.json), unreadable ones left out."""
    rows = {}
    for path in sorted((root / "scorecard").glob("*.json")) if (root / "scorecard").is_dir() else []:
        row = _load(path)
        if isinstance(row, dict) and isinstance(row.get("name"), str):
            rows[row["name"]] = row
    return rows


def _ours(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.readline().strip() == MARKER.encode()
    except OSError:
        return False
