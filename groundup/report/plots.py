"""Training plots from `metrics.jsonl`: loss (train and validation) against tokens, learning rate,
gradient norm and throughput. Rendered with matplotlib's file-only Agg backend (no display needed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # how metrics.jsonl writes them


def _number(value):
    """A metric value as a float (NaN and infinity come back from their string form), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return _NON_FINITE.get(value) if isinstance(value, str) else None


def read_metrics(path: str | Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(train steps, evaluations, events) from a metrics.jsonl; unreadable lines are skipped.

    A run that diverged logs NaN or infinity: those come back as floats (the report shows them, the
    plots leave them out), and a line with invalid bytes is skipped rather than ending the report."""
    train, evals, events = [], [], []
    path = Path(path)
    if not path.is_file():
        return train, evals, events
    for line in path.read_bytes().split(b"\n"):
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue  # a run killed mid-write leaves at most one partial last line
        if not isinstance(row, dict):
            continue
        row = {k: _NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in row.items()}
        if not isinstance(row.get("step", 0), int) or not isinstance(row.get("tokens", 0), int):
            continue  # not a line groundup wrote
        if "event" in row:
            events.append(row)
        elif _number(row.get("val_loss")) is not None:
            evals.append(row)
        elif _number(row.get("loss")) is not None:
            train.append(row)
    return train, evals, events


def series(rows: list[dict], x: str, y: str) -> tuple[list, list]:
    """The finite (x, y) points of two metrics (NaN, infinity and non-numbers are left out of plots)."""
    pairs = [(_number(r.get(x)), _number(r.get(y))) for r in rows]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_training(metrics_path: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Write loss.png, lr.png, grad_norm.png and throughput.png; returns {name: path} of those written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, evals, _ = read_metrics(metrics_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    if not train:
        return written

    def save(fig, name: str) -> None:
        path = out_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written[name] = path

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*series(train, "tokens", "loss"), label="train", linewidth=1)
    vx, vy = series(evals, "tokens", "val_loss")
    if vx:
        ax.plot(vx, vy, "o-", label="validation", markersize=3)
    ax.set(xlabel="tokens", ylabel="loss (nats/token)", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "loss")

    for key, name, title, log in (("lr", "lr", "Learning rate", False),
                                  ("grad_norm", "grad_norm", "Gradient norm (before clipping)", True),
                                  ("tokens_per_sec", "throughput", "Throughput (tokens/s)", False)):
        xs, ys = series(train, "tokens", key)
        if not xs:
            continue
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot(xs, ys, linewidth=1)
        if log and min(ys) > 0:
            ax.set_yscale("log")
        ax.set(xlabel="tokens", title=title)
        ax.grid(alpha=0.3)
        save(fig, name)
    return written
