"""Training plots from `metrics.jsonl`: loss (train and validation) against tokens, learning rate,
gradient norm and throughput. Rendered with matplotlib's file-only Agg backend (no display needed).
"""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: str | Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(train steps, evaluations, events) from a metrics.jsonl; unreadable lines are skipped."""
    train, evals, events = [], [], []
    path = Path(path)
    if not path.is_file():
        return train, evals, events
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves at most one partial last line
        if not isinstance(row, dict):
            continue
        if "event" in row:
            events.append(row)
        elif "val_loss" in row:
            evals.append(row)
        elif "loss" in row:
            train.append(row)
    return train, evals, events


def _series(rows: list[dict], x: str, y: str) -> tuple[list, list]:
    pairs = [(r[x], r[y]) for r in rows if r.get(x) is not None and r.get(y) is not None]
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
    ax.plot(*_series(train, "tokens", "loss"), label="train", linewidth=1)
    vx, vy = _series(evals, "tokens", "val_loss")
    if vx:
        ax.plot(vx, vy, "o-", label="validation", markersize=3)
    ax.set(xlabel="tokens", ylabel="loss (nats/token)", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "loss")

    for key, name, title, log in (("lr", "lr", "Learning rate", False),
                                  ("grad_norm", "grad_norm", "Gradient norm (before clipping)", True),
                                  ("tokens_per_sec", "throughput", "Throughput (tokens/s)", False)):
        xs, ys = _series(train, "tokens", key)
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
