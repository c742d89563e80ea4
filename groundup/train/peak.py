"""The peak FLOP/s of one training process, and where the number comes from, for MFU.

    peak = peak_flops(device, dtype)      # Peak(flops, source, reliable)

In order:
- `log.peak_flops` when set.
- A GPU of the datasheet table below: dense rates (not the 2:4-sparsity figures printed beside them);
  bf16 and fp16 at the BF16 rate; fp32 at the plain FP32 rate, or TF32 when
  torch.backends.cuda.matmul.allow_tf32 is on (groundup never turns it on). Source "table: <GPU> bf16".
- Otherwise a calibration: the best of several short matmuls in the compute dtype, cached per machine
  (CPU model, cores, threads, torch version, dtype; or the GPU's name) in CACHE_FILE under
  $XDG_CACHE_HOME/groundup (~/.cache/groundup), so a run on a busy machine reuses the quiet number.
  Source "calibrated <date> on <CPU>, <n> threads".

A busy machine makes a matmul slower, so a peak measured under load is too low and MFU too high
(159.5% was printed). The load is measured, not guessed: a trial's process CPU time over (wall time x
threads) is the share of the cores its threads got; below QUIET_SHARE something else ran on them. Only
quiet trials are cached. With none, the peak is the best trial's rate over its share (what the cores
do per second of CPU they get), flagged unreliable and not cached. A GPU trial has no such measure: a GPU
calibration is cached as measured.

The GPU table is also the planner's (plan/gpus.py); memory is what the device reports to CUDA
(nvidia-smi's MiB), slightly less than the marketing GB for some parts.
    A100 SXM4        datasheet: 312 TFLOP/s BF16 dense, 156 TF32, 19.5 FP32; 40 or 80 GB HBM
    H100 SXM5        989 BF16 dense, 495 TF32, 67 FP32; 80 GB HBM3
    H100 PCIe        756 BF16 dense, 378 TF32, 51 FP32; 80 GB HBM2e
    H200 SXM         989 BF16 dense, 495 TF32, 67 FP32; 141 GB HBM3e
    L40S             362 BF16 dense (FP32 accumulate), 183 TF32, 91.6 FP32; 48 GB GDDR6
    L4               121 BF16 dense, 60 TF32, 30.3 FP32; 24 GB GDDR6
    A10G (AWS g5)    70 BF16 dense, 35 TF32, 31.2 FP32; 24 GB GDDR6
    RTX 4090         165 BF16 dense with FP32 accumulate, 82.6 TF32, 82.6 FP32; 24 GB GDDR6X
    RTX 3090         71 BF16 dense with FP32 accumulate, 35.6 TF32, 35.6 FP32; 24 GB GDDR6X
    V100 SXM2        125 FP16 tensor (no BF16), 15.7 FP32; 32 GB HBM2
    MI300X           1307 BF16 dense, 654 TF32, 163 FP32 (matrix); 192 GB HBM3
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from groundup.io import atomic_write_json

MIB = 2**20
T = 1e12
CACHE_FILE = "peak_flops.json"
QUIET_SHARE = 0.85  # a trial whose threads got less of their cores than this ran beside other work
TRIALS = 5


@dataclass(frozen=True)
class GPU:
    name: str  # the key users type
    label: str
    memory_bytes: float
    bf16: float  # dense peak FLOP/s; 0: no bf16
    tf32: float
    fp32: float

    def peak(self, bf16: bool) -> float:
        return self.bf16 if bf16 else self.fp32

    def to_dict(self) -> dict:
        return asdict(self)


GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("a100-80gb", "NVIDIA A100 SXM4 80GB", 81920 * MIB, 312 * T, 156 * T, 19.5 * T),
    GPU("a100-40gb", "NVIDIA A100 SXM4 40GB", 40960 * MIB, 312 * T, 156 * T, 19.5 * T),
    GPU("h100", "NVIDIA H100 SXM5 80GB", 81559 * MIB, 989.4 * T, 494.7 * T, 66.9 * T),
    GPU("h100-pcie", "NVIDIA H100 PCIe 80GB", 81559 * MIB, 756 * T, 378 * T, 51.2 * T),
    GPU("h200", "NVIDIA H200 SXM 141GB", 143771 * MIB, 989.4 * T, 494.7 * T, 66.9 * T),
    GPU("l40s", "NVIDIA L40S 48GB", 46068 * MIB, 362.05 * T, 183 * T, 91.6 * T),
    GPU("l4", "NVIDIA L4 24GB", 23034 * MIB, 121 * T, 60 * T, 30.3 * T),
    GPU("a10g", "NVIDIA A10G 24GB", 23028 * MIB, 70 * T, 35 * T, 31.2 * T),
    GPU("rtx4090", "NVIDIA GeForce RTX 4090 24GB", 24564 * MIB, 165.2 * T, 82.6 * T, 82.6 * T),
    GPU("rtx3090", "NVIDIA GeForce RTX 3090 24GB", 24576 * MIB, 71 * T, 35.6 * T, 35.6 * T),
    GPU("v100", "NVIDIA V100 SXM2 32GB", 32768 * MIB, 0.0, 0.0, 15.7 * T),
    GPU("mi300x", "AMD Instinct MI300X 192GB", 196608 * MIB, 1307.4 * T, 653.7 * T, 163.4 * T),
)}

# What torch.cuda.get_device_name says -> the table's row; the first match wins, so specific names
# come first. None: a part the table does not hold (its peak is calibrated), e.g. the H100 NVL.
DEVICE_NAMES: tuple[tuple[str, str | None], ...] = (
    (r"H100.*NVL", None), (r"H100.*PCIe", "h100-pcie"), (r"H100", "h100"), (r"H200", "h200"),
    (r"A100.*40GB", "a100-40gb"), (r"A100", "a100-80gb"), (r"L40S", "l40s"), (r"\bL4\b", "l4"),
    (r"A10G", "a10g"), (r"RTX 4090", "rtx4090"), (r"RTX 3090", "rtx3090"), (r"V100", "v100"),
    (r"MI300X", "mi300x"),
)


@dataclass(frozen=True)
class Peak:
    flops: float  # FLOP/s of one process
    source: str  # where the number came from, for the summary
    reliable: bool = True  # False: measured under load, or proven too low by a faster step
    cache_key: str | None = None  # the calibration's entry in the cache, if it came from one


def gpu_for_device(name: str) -> GPU | None:
    """The table's row for a CUDA device name ("NVIDIA H100 80GB HBM3"), or None."""
    for pattern, key in DEVICE_NAMES:
        if re.search(pattern, name, re.I):
            return GPUS[key] if key else None
    return None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def table_peak(gpu: GPU, dtype: torch.dtype) -> tuple[float, str]:
    """(dense peak FLOP/s, which column) of a table GPU for matmuls in `dtype`."""
    if dtype in (torch.bfloat16, torch.float16):
        return gpu.bf16, "bf16"
    if torch.backends.cuda.matmul.allow_tf32:
        return gpu.tf32, "tf32"
    return gpu.fp32, "fp32"


def peak_flops(device: torch.device, dtype: torch.dtype, override: float = 0.0) -> Peak:
    """The peak FLOP/s of one process on `device` for matmuls in `dtype`, and its source."""
    if override:
        return Peak(override, "log.peak_flops")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        gpu = gpu_for_device(name)
        if gpu is not None:
            flops, column = table_peak(gpu, dtype)
            if flops:
                return Peak(flops, f"table: {gpu.label} {column}")
        return calibrated(f"cuda|{name}|torch {torch.__version__}|{dtype_name(dtype)}", name,
                          lambda: _gpu_trial(dtype, device))
    threads = torch.get_num_threads()
    where = f"{cpu_model()}, {threads} thread{'s' if threads != 1 else ''}"
    key = f"cpu|{cpu_model()}|{os.cpu_count()} cores|{threads} threads|torch {torch.__version__}|{dtype_name(dtype)}"
    return calibrated(key, where, lambda: _cpu_trial(dtype, threads))


def calibrated(key: str, where: str, trial) -> Peak:
    """The cached calibration under `key`, else a new one from TRIALS calls of `trial() -> (FLOP/s, share
    of the cores it got)`: cached when some trial was quiet, else an estimate flagged unreliable."""
    entry = read_cache().get(key)
    if isinstance(entry, dict) and isinstance(entry.get("flops"), (int, float)) and entry["flops"] > 0:
        return Peak(float(entry["flops"]), f"calibrated {entry.get('date', '?')} on {where}", True, key)
    trial()  # the first call pays for kernel selection and page faults
    runs = [trial() for _ in range(TRIALS)]
    quiet = [rate for rate, share in runs if share >= QUIET_SHARE]
    today = datetime.date.today().isoformat()
    if quiet:
        flops = max(quiet)
        write_cache_entry(key, {"flops": flops, "date": today, "quiet_trials": len(quiet), "trials": len(runs)})
        return Peak(flops, f"calibrated {today} on {where}", True, key)
    rate, share = max(runs, key=lambda r: r[0] / max(r[1], 1e-3))
    return Peak(rate / max(share, 1e-3), f"estimated {today} on {where}, under load: its threads got {share:.0%} "
                "of their cores, so not cached", False)


def _cpu_trial(dtype: torch.dtype, threads: int, seconds: float = 0.06) -> tuple[float, float]:
    """(FLOP/s, share of `threads` cores the process got) of square matmuls for `seconds`."""
    n = (1024 if dtype == torch.float32 else 512) * (2 if threads > 4 else 1)
    a, b = _operands(n, n, n, dtype, "cpu")
    count, cpu, start = 0, time.process_time(), time.perf_counter()
    while True:
        a @ b
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            share = (time.process_time() - cpu) / (elapsed * threads)
            return 2 * n**3 * count / elapsed, share


def _gpu_trial(dtype: torch.dtype, device: torch.device) -> tuple[float, float]:
    return measure_matmul_flops(dtype, 4096, 0.2, device), 1.0


def _operands(m: int, k: int, n: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)  # not the global RNG: a resumed run's dropout needs it
    return (torch.randn(m, k, device=device, generator=gen).to(dtype),
            torch.randn(k, n, device=device, generator=gen).to(dtype))


def measure_matmul_flops(dtype: torch.dtype = torch.float32, n: int = 1024, seconds: float = 0.3,
                         device: str | torch.device = "cpu", shape: tuple[int, int, int] | None = None) -> float:
    """FLOP/s of (m x k) @ (k x n) matmuls on this device (square n x n unless `shape`), as measured now."""
    m, k, n = shape or (n, n, n)
    a, b = _operands(m, k, n, dtype, device)
    a @ b  # warm up the kernel choice
    cuda = torch.device(device).type == "cuda"
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * m * k * n * count / elapsed


def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware")) and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cache_path() -> Path:
    """$XDG_CACHE_HOME/groundup/peak_flops.json (~/.cache when XDG_CACHE_HOME is unset or relative)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "groundup" / CACHE_FILE


def read_cache() -> dict:
    """The cached calibrations; an unreadable or malformed file reads as empty (it is rewritten)."""
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache_entry(key: str, entry: dict | None) -> None:
    """Set (or with None, forget) one calibration; a cache that cannot be written only costs a re-measure."""
    data = read_cache()
    if entry is None:
        if data.pop(key, None) is None:
            return
    else:
        data[key] = entry
    try:
        atomic_write_json(cache_path(), data)
    except OSError:
        pass


def distrust(peak: Peak, why: str) -> Peak:
    """`peak` marked unreliable because `why`; a cached calibration is forgotten, so the next run measures again."""
    if peak.cache_key is not None:
        write_cache_entry(peak.cache_key, None)
    return Peak(peak.flops, f"{peak.source}; unreliable: {why}", False)
