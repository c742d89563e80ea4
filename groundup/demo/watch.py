"""While pretraining runs: re-plan its time limit as the machine's speed changes.

Pretraining logs its rate (training tokens/s) every few steps in RUN/metrics.jsonl. Its first rates
after the warm-up are the machine's speed at the load the demo's costs were measured at; the slowdown is those over the
recent ones. Every WATCH_S a thread here re-plans pretraining's limit with every cost still to come
scaled by the slowdown (`replan`, demo/budget.py) and, when the limit moved by more than MOVE_SHARE
(at least MIN_MOVE_S), writes the new one to the run's train.time_limit_file: the run re-plans its
steps to it (train/time_budget.py). So a load that arrives during pretraining is paid for by
pretraining, and SFT and alignment keep what they need.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Callable

from groundup.train.time_budget import write_time_limit

WATCH_S = 2.0  # seconds between looks at the metrics
SKIP = 1  # logged rates left out of the reference: the first interval holds the session's warm-up steps
FIRST = 3  # logged rates after those that make the reference speed
HELD = 0.15  # a slowdown within this of 1 counts as none: step times wander that much on a steady load
RECENT = 5  # logged rates that make the speed now (their median: 10 steps at log.every 2)
MOVE_SHARE = 0.05  # a re-plan that moves the limit by less than this share of it is not written
MIN_MOVE_S = 2.0


def step_rates(metrics: Path) -> list[float]:
    """Training tokens/s of each logged interval after the first step (which warms kernels up)."""
    rates = []
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return rates
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # the line being written
            continue
        if record.get("step", 0) > 1 and "event" not in record and record.get("tokens_per_sec"):
            rates.append(float(record["tokens_per_sec"]))
    return rates


class PretrainWatch:
    """`replan(rate, slowdown) -> seconds`: pretraining's limit when its first rate is `rate` tokens/s and the
    machine is `slowdown` times slower than then. Use as a context manager around the pretraining verb."""

    def __init__(self, metrics: Path, limit_file: Path, limit: float,
                 replan: Callable[[float, float], float], every: float = WATCH_S):
        self.metrics, self.limit_file, self.limit, self.replan, self.every = metrics, limit_file, limit, replan, every
        self.moves: list[dict] = []
        self.slowdown = 1.0
        self.rate: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-pretrain-watch", daemon=True)
        self._started = time.perf_counter()

    def __enter__(self) -> PretrainWatch:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.check()

    def check(self) -> dict | None:
        """Re-plan from the rates logged so far; the move written, if any."""
        rates = step_rates(self.metrics)
        if len(rates) < SKIP + FIRST + 1:
            return None
        self.rate = statistics.median(rates[SKIP : SKIP + FIRST])
        self.slowdown = self.rate / statistics.median(rates[-RECENT:])
        held = abs(self.slowdown - 1) <= HELD
        seconds = round(self.replan(self.rate, 1.0 if held else self.slowdown), 1)
        if abs(seconds - self.limit) < max(MIN_MOVE_S, MOVE_SHARE * self.limit):
            return None
        move = {"after_s": round(time.perf_counter() - self._started, 1), "slowdown": round(self.slowdown, 2),
                "from_s": self.limit, "to_s": seconds}
        write_time_limit(self.limit_file, seconds)
        self.limit = seconds
        self.moves.append(move)
        return move
