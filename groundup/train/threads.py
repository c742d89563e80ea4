"""How many CPU threads to use, measured rather than assumed (`train.threads = -1`, the demo).

On a 2-core machine with another process busy, torch's default (one thread per core) makes every
parallel kernel wait for the core the other process holds: training steps measured here took 6x to
30x longer with two threads than with one. `fastest_threads` times the same small matmul workload
(projection-shaped) with 1, 2, ... up to the usable cores and sets torch's thread count to the
fastest: every core on a quiet machine, fewer on a busy one; it takes about a tenth of a second.
`ThreadTuner` repeats it during training every CHECK_SECONDS, since the load on a shared machine
comes and goes. Changing the thread count changes the order of float sums, so a run tuned this way
is not bit-identical to another; set a fixed `train.threads` for that.
"""

from __future__ import annotations

import os
import time

import torch

SECONDS_PER_TRY = 0.04
CHECK_SECONDS = 10.0  # of training between measurements


def _workload(d_model: int, tokens: int) -> float:
    """Seconds per round of projection-shaped matmuls, the best of a few rounds."""
    x = torch.randn(tokens, d_model)
    w = torch.randn(d_model, 3 * d_model)
    best = float("inf")
    deadline = time.perf_counter() + SECONDS_PER_TRY
    while time.perf_counter() < deadline or best == float("inf"):
        started = time.perf_counter()
        y = x @ w
        _ = y.T @ x  # the backward's weight-gradient shape
        best = min(best, time.perf_counter() - started)
    return best


def fastest_threads(d_model: int = 128, tokens: int = 4096) -> tuple[int, dict[int, float]]:
    """(the fastest thread count, {threads: seconds per round}); torch is left set to the fastest."""
    cores = usable_cores()
    timings = {}
    for n in range(1, cores + 1):
        torch.set_num_threads(n)
        timings[n] = _workload(d_model, tokens)
    best = min(timings, key=timings.get)
    torch.set_num_threads(best)
    return best, timings


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class ThreadTuner:
    """Re-measures the fastest thread count every CHECK_SECONDS of training (CPU only)."""

    def __init__(self, enabled: bool, d_model: int):
        self.enabled, self.d_model = enabled and usable_cores() > 1, d_model
        self.since = 0.0
        self.threads = fastest_threads(d_model)[0] if self.enabled else torch.get_num_threads()

    def after_step(self, seconds: float) -> int | None:
        """The new thread count when a measurement changed it, else None."""
        if not self.enabled:
            return None
        self.since += seconds
        if self.since < CHECK_SECONDS:
            return None
        self.since = 0.0
        best = fastest_threads(self.d_model)[0]
        if best == self.threads:
            return None
        self.threads = best
        return best
