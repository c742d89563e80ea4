"""What a run reports: metrics.jsonl, a progress bar, TensorBoard and W&B, and MFU.

metrics.jsonl holds one JSON object per line: logged steps (step, tokens, loss, lr, grad_norm
before clipping, grad_norm_clipped, tokens_per_sec, mfu, elapsed_s, ...), evaluation lines
(val_loss, val_bpb, val_bpb/<domain>) and events (an `event` key: skip, data_gate, rollback,
resume, interrupt). Only the main process writes. A checkpoint records the file's length, so a
resumed run first cuts off the lines written after that checkpoint and the file reads as one run.

MFU = the FLOPs per token the step does (train/flops.py: LoRA, frozen layers) x tokens/s / the peak
FLOP/s of all processes (train/peak.py: `log.peak_flops`, a table of known GPUs, or a quiet calibration
cached per machine); HFU also counts activations recomputed by checkpointing. `Utilization` keeps both
at or below 100%; summary.json says where the peak came from.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from groundup.errors import ConfigError
from groundup.io import open_named
from groundup.layout import METRICS_FILE
from groundup.train.flops import StepFlops
from groundup.train.peak import Peak, distrust

class Utilization:
    """MFU, and HFU where activations are recomputed, of a throughput in tokens/s.

    MFU = tokens/s x the FLOPs per token the step does (train/flops.py) / the peak of all processes
    (train/peak.py); HFU counts the recomputed forward too. Neither can exceed 100%: a rate that would
    proves the peak too low (a calibration taken on a busy machine), so the peak is distrusted (a cached
    calibration forgotten), the run says so once, and MFU is not reported (None) from then on."""

    def __init__(self, flops: StepFlops, peak: Peak, processes: int, note=print):
        self.flops, self.peak, self.processes, self.note = flops, peak, processes, note
        self.disproved = False

    @property
    def total_peak(self) -> float:
        return self.peak.flops * self.processes

    def of(self, rate: float) -> dict:
        """{"mfu": ...} (and "hfu" with recomputation) at `rate` tokens/s; None once the peak is disproved."""
        hfu = rate * self.flops.hardware / self.total_peak
        if hfu > 1 and not self.disproved:
            self.disproved = True
            self.peak = distrust(self.peak, f"{rate:,.0f} tokens/s x {self.flops.hardware:,.0f} FLOPs per token "
                                            f"is {hfu:.0%} of it")
            self.note(f"MFU not reported: the peak ({self.peak.source}) is below what the run measurably does")
        mfu = None if self.disproved else rate * self.flops.model / self.total_peak
        out = {"mfu": mfu}
        if self.flops.recompute:
            out["hfu"] = None if self.disproved else hfu
        return out

    def summary(self, rate: float) -> dict:
        """The summary's utilisation keys at the session's rate."""
        return {**self.of(rate), "flops_per_token": self.flops.model, "flops_per_token_hardware": self.flops.hardware,
                "peak_flops": self.total_peak, "peak_flops_source": self.peak.source,
                "peak_flops_reliable": self.peak.reliable}


def flops_text(flops: float) -> str:
    """1.062e11 -> "106.2 GFLOP/s"."""
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if flops >= scale:
            return f"{flops / scale:,.1f} {unit}"
    return f"{flops:,.0f} FLOP/s"


def describe_utilization(summary: dict) -> str:
    """The closing line's utilisation: "MFU 15.9% of 106.2 GFLOP/s (calibrated ...)", HFU beside it."""
    peak = f"{flops_text(summary['peak_flops'])} ({summary['peak_flops_source']})"
    if summary.get("mfu") is None:
        return f"MFU not reported: peak {peak}"
    hfu = f" (HFU {summary['hfu']:.1%} with the recomputed forward)" if summary.get("hfu") is not None else ""
    return f"MFU {summary['mfu']:.1%}{hfu} of {peak}"


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
        self.file = open_named(self.path, "a", encoding="utf-8") if enabled else None  # full disk: names it
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
                                     "mfu " + (f"{record['mfu']:.1%}" if record.get("mfu") is not None else "n/a"),
                                     refresh=False)

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
