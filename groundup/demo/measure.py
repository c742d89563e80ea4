"""What this machine does per second now, measured on the untrained model before the budget is split.

    measure_machine(OUT/models/untrained, batch=32, seq_len=128)
      -> {"train_step_s", "train_tokens", "forward_s", "int8_forward_s", "forward_tokens", "load", "cores"}

- a pretraining-shaped training step (forward and backward; pretraining itself then measures the
  optimizer's share, demo/watch.py), the currency of every training stage's few steps;
- a forward of one evaluation batch by the model and by its int8 copy: int8 weight-only matmuls are
  slower than float ones on a CPU, so the quantized model's report-card row costs more than the others
  (3x measured at load 6), and the budget reserves it at its own price;
- the load average and the usable cores, for the costs measured before any training stage ran.

Each takes the median of a few rounds after one warm-up round: about a second on a quiet 2-core machine.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

from groundup.loading import load_for_inference
from groundup.model import Transformer
from groundup.quant import quantize_model
from groundup.train.threads import usable_cores

ROUNDS = 3  # timed rounds of each measurement, after one warm-up round
EVAL_ROWS = 8  # rows of a scorecard bits-per-byte batch (eval/perplexity.py)


def _median_time(fn, rounds: int = ROUNDS) -> float:
    fn()  # warm-up: allocation, kernel choice
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def train_step_seconds(model: Transformer, batch: int, seq_len: int, rounds: int = ROUNDS) -> float:
    """The median seconds of a forward and backward of `batch` x `seq_len` random tokens (no optimizer)."""
    seq_len = min(seq_len, model.cfg.max_seq_len)
    rows = torch.randint(model.cfg.vocab_size, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    model.train().requires_grad_(True)

    def train_step() -> None:
        model(rows[:, :-1], rows[:, 1:]).loss.backward()
        model.zero_grad(set_to_none=True)

    return _median_time(train_step, rounds)


def measure_machine(model_dir: str | Path, batch: int, seq_len: int) -> dict:
    """Seconds of a training step of up to EVAL_ROWS x `seq_len` tokens (a busy machine makes a full batch
    dear to time; a smaller one prices a token a little high) and of an evaluation forward, float and int8."""
    model, _ = load_for_inference(model_dir)
    context = model.cfg.max_seq_len
    seq_len, batch = min(seq_len, context), min(batch, EVAL_ROWS)
    generator = torch.Generator().manual_seed(0)
    train_step_s = train_step_seconds(model, batch, seq_len)
    model.eval().requires_grad_(False)
    evaluation = torch.randint(model.cfg.vocab_size, (EVAL_ROWS, context), generator=generator)

    @torch.no_grad()
    def forward() -> None:
        model(evaluation)

    forward_s = _median_time(forward)
    quantize_model(model, "int8")
    int8_forward_s = _median_time(forward)
    return {"train_step_s": train_step_s, "train_tokens": batch * seq_len, "forward_s": forward_s,
            "int8_forward_s": int8_forward_s, "forward_tokens": EVAL_ROWS * context,
            "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0, "cores": usable_cores()}
