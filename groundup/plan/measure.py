"""Peak tensor memory of a CPU process, measured with the profiler's allocation events.

There is no torch.cuda.max_memory_allocated on CPU. torch.profiler with profile_memory=True
records every allocation and free of torch's CPU allocator on the profiling thread as a
"[memory]" event; replaying them in time order gives the bytes of live tensors at every moment,
and its maximum is the peak. The model, its wrapper and the optimizer are built inside the
profiled region, so the count starts from zero there.

Frees on other threads: gloo's worker threads often drop the last reference to a collective's
tensors, and the profiler records no event for that, so a plain sum of the events counts such a
tensor forever (measured: up to a gradient-sized 22 MB too much). Two remedies, the first used
when available:
- process-wide accounting: c10's CPU allocator keeps a size table and a running total of live
  bytes for *every* thread when its flag `caffe2_report_cpu_memory_usage` is set (set here via
  ctypes on libc10; it also turns on a per-allocation LOG(INFO) that the default log level
  hides). Each event then carries that total ("Total Allocated" in the trace), which already
  reflects frees made by other threads; the peak is its maximum minus its value at the start.
- otherwise, addresses: when the allocator hands out a live block's address again, the block must
  have been freed before; it is taken off there (an upper bound, never an undercount).
`method` says which one measured. What neither sees: memory allocated outside torch's allocator
(gloo's scratch buffers, the Python heap). tests/test_plan.py checks the method on tensors of
known size, one freed on another thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from dataclasses import dataclass, field


@dataclass
class PeakMemory:
    peak: float = 0.0  # bytes of live tensors at the peak
    final: float = 0.0  # bytes still live when the region ended
    events: int = 0
    inferred_free_bytes: float = 0.0  # address method: blocks freed on another thread (seen by address reuse)
    method: str = ""  # "allocator total" or "addresses"
    marks: dict[str, float] = field(default_factory=dict)  # peak bytes per labelled span
    starts: dict[str, float] = field(default_factory=dict)  # live bytes when each labelled span began


def _trace_events(prof) -> tuple[list[tuple[float, int, int, int, int]], list[tuple[str, float, float]]]:
    """(time, order, address, bytes, allocator total) of allocation events, (label, start, end) of spans."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    memory, spans = [], []
    for i, e in enumerate(trace.get("traceEvents", [])):
        name = e.get("name", "")
        if name == "[memory]":
            args = e["args"]
            memory.append((float(e["ts"]), int(args.get("Ev Idx", i)), int(args["Addr"]), int(args["Bytes"]),
                           int(args.get("Total Allocated", 0))))
        elif name.startswith("plan:") and e.get("ph") == "X":
            spans.append((name[5:], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
    memory.sort()
    spans.sort(key=lambda s: s[1])
    return memory, spans


def replay(memory: list[tuple[float, int, int, int, int]], spans: list[tuple[str, float, float]],
           allocator_total: bool = False) -> PeakMemory:
    """Live bytes along the events: from the allocator's process-wide total, or by addresses."""
    result = PeakMemory(events=len(memory), method="allocator total" if allocator_total else "addresses")
    base = memory[0][4] - memory[0][3] if memory else 0
    live_blocks: dict[int, int] = {}
    live = 0
    open_spans: list[tuple[str, float, float]] = []
    k = 0
    for t, _, addr, nbytes, total in memory:
        if allocator_total:  # the total just before this event (other threads' frees included)
            live = total - nbytes - base
        while k < len(spans) and spans[k][1] <= t:
            label = spans[k][0]
            result.starts.setdefault(label, live)
            result.marks.setdefault(label, live)
            open_spans.append(spans[k])
            k += 1
        if allocator_total:
            live = total - base
        elif nbytes > 0:
            if addr in live_blocks:  # reused: the old block was freed where we could not see it
                stale = live_blocks.pop(addr)
                live -= stale
                result.inferred_free_bytes += stale
            live_blocks[addr] = nbytes
            live += nbytes
        elif addr in live_blocks:
            live -= live_blocks.pop(addr)
        result.peak = max(result.peak, live)
        open_spans = [s for s in open_spans if s[2] >= t]
        for label, _, _ in open_spans:
            if live > result.marks[label]:
                result.marks[label] = live
    result.final = live
    return result


def _flag():
    import ctypes

    import torch

    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    return ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage")


def process_wide_accounting(on: bool = True) -> bool:
    """Turn c10's process-wide CPU allocation accounting on (False if this torch build lacks it).

    Once on, leave it on while measuring: a block freed while it is off stays in the allocator's
    size table, and a later free at the same address would take off the wrong size. It costs
    about 1-2 us per allocation; `process_wide_accounting(False)` when the process measures no more.
    """
    try:
        _flag().value = on
        return True
    except (OSError, ValueError, AttributeError):
        return False


@contextlib.contextmanager
def track_peak(allocator_total: bool | None = None):
    """Measure the peak of live tensor bytes inside the block; label phases with `span(name)`.

    The yielded PeakMemory is filled in when the block exits. `allocator_total`: use the
    allocator's process-wide total (default: when it can be turned on; it is left on, see
    process_wide_accounting), else addresses.
    """
    from torch.profiler import ProfilerActivity, profile

    use_total = allocator_total is not False and process_wide_accounting()
    result = PeakMemory()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        yield result
    measured = replay(*_trace_events(prof), allocator_total=use_total)
    result.__dict__.update(measured.__dict__)


def span(name: str):
    """A labelled part of a tracked region (its peak is reported under `marks[name]`, the live
    bytes when it began under `starts[name]`)."""
    from torch.profiler import record_function

    return record_function(f"plan:{name}")


def torchrun_json(program: list[str], processes: int, timeout: float = 600, pythonpath: str | None = None) -> dict:
    """Run `program` (a script path or `-m module`, then its flags) under torchrun with `processes` gloo
    processes, one thread each, and return the JSON object it writes to the file given as `--json-out`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               *program, "--json-out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", **({"PYTHONPATH": pythonpath} if pythonpath else {})}
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        if result.returncode != 0 or not out.exists():
            raise RuntimeError(f"torchrun failed ({result.returncode}):\n{result.stderr[-4000:]}")
        return json.loads(out.read_text())

