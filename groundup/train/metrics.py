"""What a run reports: metrics.jsonl, a progress bar, TensorBoard and W&B, and MFU.

metrics.jsonl holds one JSON object per line: logged steps (step, tokens, loss, lr, grad_norm
before clipping, grad_norm_clipped, tokens_per_sec, mfu, elapsed_s, ...), evaluation lines
(val_loss, val_bpb, val_bpb/<domain>) and events (an `event` key: skip, data_gate, rollback,
resume, interrupt). Only the main process writes. A checkpoint records the file's length, so a
resumed run first cuts off the lines written after that checkpoint and the file reads as one run.

MFU = model FLOPs per token (6N + attention, model/sizing.py) x tokens/s / peak FLOP/s of all
processes. The peak comes from `log.peak_flops`, else a table of known accelerators, else (CPU)
a short matmul measurement in the compute dtype.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from groundup.errors import ConfigError
from groundup.layout import METRICS_FILE

# Dense peak FLOP/s per device: (bf16, fp32 as TF32 tensor-core math).
PEAK_FLOPS = {
    "H200": (989e12, 494e12),
    "H100 SXM": (989e12, 494e12),
    "H100 NVL": (835e12, 418e12),
    "H100 PCIe": (756e12, 378e12),
    "H100": (989e12, 494e12),
    "A100": (312e12, 156e12),
    "L40S": (362e12, 183e12),
    "L4": (121e12, 60e12),
    "A10G": (70e12, 35e12),
    "RTX 4090": (165e12, 83e12),
    "MI300X": (1307e12, 654e12),
}


def measure_matmul_flops(dtype: torch.dtype = torch.float32, n: int = 1024, seconds: float = 0.3,
                         device: str | torch.device = "cpu", shape: tuple[int, int, int] | None = None) -> float:
    """FLOP/s of (m x k) @ (k x n) matmuls on this device (square n x n unless `shape`)."""
    m, k, n = shape or (n, n, n)
    gen = torch.Generator(device=device).manual_seed(0)  # not the global RNG: a resumed run's dropout needs it
    a = torch.randn(m, k, device=device, generator=gen).to(dtype)
    b = torch.randn(k, n, device=device, generator=gen).to(dtype)
    a @ b  # warm up the kernel choice
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * m * k * n * count / elapsed


def peak_flops(device: torch.device, dtype: torch.dtype, override: float = 0.0) -> tuple[float, str]:
    """(peak FLOP/s of one process, where the number came from)."""
    if override:
        return override, "log.peak_flops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, (bf16, fp32) in PEAK_FLOPS.items():
            if key.lower() in name.lower():
                return (bf16 if dtype == torch.bfloat16 else fp32), f"table: {key}"
        return measure_matmul_flops(dtype, 4096, 0.5, device), f"measured matmul on {name}"
    dtype_name = str(dtype).removeprefix("torch.")
    n = 1024 if dtype == torch.float32 else 256  # bf16 without bf16 instructions is slow: keep it short
    return measure_matmul_flops(dtype, n), f"measured {dtype_name} matmul on CPU"


def check_trackers(tensorboard: bool, wandb: bool) -> None:
    """Fail before any work when a tracker is asked for but not installed."""
    import importlib.util

    for wanted, module, key in ((tensorboard, "tensorboard", "log.tensorboard"), (wandb, "wandb", "log.wandb")):
        if wanted and importlib.util.find_spec(module) is None:
            raise ConfigError(f"{key} = true needs the {module} package (pip install {module})", key=key)


class MetricsLog:
    """Writes metrics.jsonl (main process only) and mirrors scalars to the progress bar and trackers."""

    def __init__(self, run_dir: Path, enabled: bool, total_steps: int, start_step: int, progress: bool,
                 tensorboard: bool = False, wandb: bool = False, wandb_project: str = "groundup",
                 run_config: dict | None = None):
        self.enabled = enabled
        self.path = run_dir / METRICS_FILE
        self.file = open(self.path, "a", encoding="utf-8") if enabled else None
        self.bar = None
        if enabled and progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
        self.tb = self.wandb = None
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        if enabled and wandb:
            import wandb as wandb_module

            self.wandb = wandb_module
            wandb_module.init(project=wandb_project, name=run_dir.name, config=run_config, resume="allow")

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(_jsonable(record)) + "\n")
        self.file.flush()  # a kill loses at most the line being written; resume cuts it off
        step = record.get("step", 0)
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("step",)}
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def step(self, record: dict) -> None:
        """A logged training step: the line, and the progress bar's postfix."""
        self.write(record)
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {record['loss']:.4f} lr {record['lr']:.2e} gnorm "
                                     f"{record['grad_norm']:.3g} {record['tokens_per_sec']:,.0f} tok/s "
                                     f"mfu {record['mfu']:.1%}", refresh=False)

    def advance(self, steps: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(steps)

    def note(self, text: str) -> None:
        """A message for the person watching (printed above the progress bar)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def offset(self) -> int:
        """Bytes written so far (a checkpoint records it)."""
        return self.file.tell() if self.file is not None else 0

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def truncate_metrics(run_dir: Path, offset: int) -> None:
    """Cut metrics.jsonl back to `offset` bytes: drop what a killed run logged after its checkpoint."""
    path = run_dir / METRICS_FILE
    if path.exists() and path.stat().st_size > offset:
        with open(path, "r+b") as f:
            f.truncate(offset)


def _jsonable(record: dict) -> dict:
    """NaN and infinity are not JSON: write them as strings so every line stays parseable."""
    out = {}
    for key, value in record.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        out[key] = value
    return out
