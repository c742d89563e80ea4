"""A hang ends the attempt, never the run: the hang detector, and the faults tests inject to prove it.

    with watch(run_dir, rank, cfg.train.hang_timeout_s) as step_done:   # the session holds it
        ... step_done(step) after every optimizer step (train/loop.py) ...

`watch` starts a daemon thread that wakes a few times per timeout. When the process has not finished
a step for `hang_timeout_s` seconds (a peer that stopped answering, a deadlocked data worker, a stuck
device), it writes every thread's stack (faulthandler) to RUN/hang-rank{R}.txt and leaves with
HANG_EXIT_CODE through os._exit: no cleanup that could block on the same hang. torchrun
(--max-restarts), Slurm (--requeue) or Ray Train (FailureConfig) then starts a new attempt, which
resumes from the newest intact checkpoint (train.auto_resume). The clock starts when the loop
begins, so loading a base model or DPO's reference pass is not counted; an evaluation or a checkpoint
between two steps is, so the timeout must exceed the longest of them. A collective that waits for a
dead or stuck peer also fails on its own after distributed.timeout_s (the process group's timeout).

The recovery experiment (benchmarks/recovery.py) and tests make ranks fail on purpose, through
GROUNDUP_FAULT: comma-separated `kill:rank=R:step=S` (rank R sends itself SIGKILL once it finished
step S) and `hang:rank=R:step=S` (rank R stops answering there, forever). Each fault fires once per
run directory: RUN/.fault-{i}.done is written before it fires, so the restarted attempt passes it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from groundup.errors import ConfigError
from groundup.layout import FAULT_DONE_FILE, HANG_DUMP_FILE

FAULT_ENV = "GROUNDUP_FAULT"
HANG_EXIT_CODE = 124  # what a process the hang detector ended exits with (timeout(1)'s code for "timed out")
_FAULT = re.compile(r"^(kill|hang):rank=(\d+):step=(\d+)$")


@dataclass(frozen=True)
class Fault:
    index: int  # position in GROUNDUP_FAULT: names its done-marker
    kind: str  # kill or hang
    rank: int  # global rank
    step: int  # fires once this optimizer step has finished


def parse_faults(spec: str | None) -> list[Fault]:
    """GROUNDUP_FAULT's faults; a malformed entry is a ConfigError naming it (a test must not run without it)."""
    faults = []
    for i, part in enumerate(p.strip() for p in (spec or "").split(",") if p.strip()):
        m = _FAULT.match(part)
        if m is None:
            raise ConfigError(f"{FAULT_ENV}={spec!r}: entry {part!r} is not kill:rank=R:step=S or hang:rank=R:step=S",
                              key=FAULT_ENV)
        faults.append(Fault(i, m.group(1), int(m.group(2)), int(m.group(3))))
    return faults


def _fire(fault: Fault, run_dir: Path) -> None:
    marker = run_dir / FAULT_DONE_FILE.format(index=fault.index)
    try:
        with open(marker, "x") as f:  # exclusive create: written once, before the fault, so it never repeats
            f.write(f"{fault.kind} rank {fault.rank} step {fault.step} at {time.time():.3f}\n")
    except FileExistsError:
        return
    print(f"{FAULT_ENV}: rank {fault.rank} {fault.kind} at step {fault.step}", file=sys.stderr, flush=True)
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang: stop answering; the hang detector or a peer's collective timeout ends the attempt
        time.sleep(3600)


class HangDetector:
    """The watchdog thread: ends the process when `beat` has not been called for `timeout_s` seconds."""

    def __init__(self, run_dir: Path, rank: int, timeout_s: float, exit_code: int = HANG_EXIT_CODE):
        self.path = Path(run_dir) / HANG_DUMP_FILE.format(rank=rank)
        self.rank, self.timeout_s, self.exit_code = rank, timeout_s, exit_code
        self.step, self.last = None, time.monotonic()
        self._stop, self._started = threading.Event(), False
        self._thread = threading.Thread(target=self._watch, name=f"groundup-hang-detector-{rank}", daemon=True)

    def beat(self, step: int) -> None:
        """Progress: `step` finished now (the first beat starts the clock)."""
        self.step, self.last = step, time.monotonic()
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            idle = time.monotonic() - self.last
            if idle >= self.timeout_s:
                self._dump(idle)
                os._exit(self.exit_code)  # no cleanup: it could block on the very thing that hangs

    def _dump(self, idle: float) -> None:
        header = (f"groundup hang detector: rank {self.rank} made no progress for {idle:.1f} s "
                  f"(train.hang_timeout_s = {self.timeout_s:g}); last finished step: {self.step}; pid {os.getpid()}; "
                  f"exiting with {self.exit_code}\n\n")
        try:
            with open(self.path, "w") as f:
                f.write(header)
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError as e:  # the run directory is gone or full: the exit still matters more
            print(f"hang detector: cannot write {self.path}: {e}", file=sys.stderr, flush=True)
        print(header.strip() + f"; stacks in {self.path}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def watch(run_dir: str | Path, rank: int, timeout_s: float) -> Iterator[Callable[[int], None]]:
    """`step_done(step)` for the loop: beats the hang detector (when timeout_s > 0) and fires the
    GROUNDUP_FAULT faults of this rank at that step. The detector runs from the first call on."""
    run_dir = Path(run_dir)
    faults = [f for f in parse_faults(os.environ.get(FAULT_ENV)) if f.rank == rank]
    detector = HangDetector(run_dir, rank, timeout_s) if timeout_s > 0 else None

    def step_done(step: int) -> None:
        if detector is not None:
            detector.beat(step)
        for fault in faults:
            if fault.step == step:
                _fire(fault, run_dir)

    try:
        yield step_done
    finally:
        if detector is not None:
            detector.stop()
