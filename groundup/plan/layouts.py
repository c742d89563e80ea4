"""The plan's memory estimate of each parallel layout against the measured peak of groundup's own training step.

    python -m torch.distributed.run --standalone --nproc-per-node 4 -m groundup.plan.layouts --json-out OUT.json
    python -m groundup.plan.layouts --launch        # does that, then prints the JSON

Each process builds the training state with groundup.train (`init_distributed`, `build_state`: the
layout's wrapping, sharding, pipeline stages or expert shards, and optimizers) and runs `train_step` on
random tokens, under the profiler's allocation tracking (plan/measure.py). The first step is left out of
the peak (AdamW makes its state there). The largest process's peak is compared with `predict_memory` for
the same layout on CPU in fp32. LAYOUTS lists what is measured: a tiny model on 4 processes, each layout
the plan has a row for beyond plain DDP and FSDP (tests/test_plan.py measures those two).
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import torch

from groundup.config import load_config
from groundup.plan.estimate import predict_memory
from groundup.plan.measure import process_wide_accounting, span, torchrun_json, track_peak
from groundup.tokens.loader import Batch
from groundup.train.config import TrainConfig
from groundup.train.distributed import init_distributed
from groundup.train.objective import NextTokenObjective
from groundup.train.state import build_state
from groundup.train.step import train_step

PROCESSES = 4
MODEL = ["model.vocab_size=1024", "model.d_model=64", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=2",
         "model.max_seq_len=128", "model.tie_embeddings=false", "model.name=layout-check"]
RUN = ["train.batch_size=4", "train.seq_len=128", "train.device=cpu", "distributed.backend=gloo",
       "precision.mode=fp32", "precision.cpu_bf16_matmul=native", "optim.name=adamw",
       "stability.max_repeat_fraction=1.0", "eval.every=0", "eval.at_end=false"]
MOE = ["model.n_experts=4", "model.moe_top_k=2", "model.moe_bias_update_rate=0"]
# name: (the plan's strategy, its keyword arguments, the training config's overrides)
LAYOUTS = {
    "hsdp": ("hsdp", {"gpus_per_node": 2}, ["distributed.strategy=hsdp", "distributed.replicas=2"]),
    "ep-ddp": ("ddp", {"ep": 2}, [*MOE, "distributed.strategy=ddp", "distributed.ep=2"]),
    "ep-fsdp": ("fsdp", {"ep": 2}, [*MOE, "distributed.strategy=fsdp", "distributed.ep=2"]),
    "pp-1f1b": ("pp", {"pp": 2}, ["distributed.strategy=fsdp", "distributed.pp=2", "distributed.pp_schedule=1f1b"]),
    "pp-interleaved": ("pp", {"pp": 2, "pp_schedule": "interleaved_1f1b"},
                       ["distributed.strategy=fsdp", "distributed.pp=2",
                        "distributed.pp_schedule=interleaved_1f1b"]),
}


def layout_config(name: str, extra: list[str] | tuple = ()) -> TrainConfig:
    return load_config(TrainConfig, None, [*MODEL, *RUN, *LAYOUTS[name][2], *extra])


class _Tokens:
    """Random batches of this process's data-parallel rank (a loader as train_step reads it)."""

    def __init__(self, cfg, rank: int):
        self.gen = torch.Generator().manual_seed(1 + rank)
        self.shape, self.vocab = (cfg.train.batch_size, cfg.train.seq_len + 1), cfg.model.vocab_size

    def __next__(self) -> Batch:
        t = torch.randint(0, self.vocab, self.shape, generator=self.gen)
        return Batch(t[:, :-1], t[:, 1:], [[] for _ in range(self.shape[0])], ["text"] * self.shape[0])

    def __iter__(self):
        return self


def measure(cfg, steps: int = 2) -> dict:
    """This process's peak of live tensor bytes over steps 2.. of groundup's training step."""
    gc.collect()
    with track_peak() as peak:
        with span("build"):
            d = init_distributed(cfg, cfg.model)
            state = build_state(cfg, d, NextTokenObjective(cfg), _Tokens(cfg, d.rank))
        for step in range(steps):
            with span(f"step{step}"):
                train_step(state)
                state.step += 1
        del state
    return {"peak": max(peak.marks[f"step{s}"] for s in range(1, steps)), "method": peak.method, "dist": d}


def worker(names: list[str], out: Path, steps: int) -> None:
    process_wide_accounting()  # from the start, so that the allocator's size table knows every block
    torch.set_num_threads(1)
    results, d = {}, None
    for name in names:
        cfg = layout_config(name)
        m = measure(cfg, steps)
        d = m.pop("dist")
        peaks = _all(m["peak"], d)
        strategy, kwargs, _ = LAYOUTS[name]
        predicted = predict_memory(cfg, strategy, d.processes, device="cpu", mode="fp32", **kwargs)
        results[name] = {"strategy": strategy, **kwargs, "processes": d.processes, "predicted": predicted.peak,
                         "predicted_phase": predicted.phase, "measured": max(peaks), "measured_per_process": peaks,
                         "ratio": predicted.peak / max(peaks), "method": m["method"],
                         "predicted_parts": predicted.parts,
                         # pipelines: each pipeline rank's own estimate (processes are grouped by rank)
                         "predicted_per_pipeline_rank": [x.total for x in predicted.moments
                                                         if x.name.startswith("pp rank")]}
    if d is not None and d.is_main:
        out.write_text(json.dumps({"model": MODEL + RUN, "steps": steps, "results": results}, indent=2))
    if d is not None:
        d.close()


def _all(value: float, d) -> list[float]:
    import torch.distributed as dist

    box = [None] * d.processes
    dist.all_gather_object(box, value)
    return box


def launch(names: list[str] | None = None, steps: int = 2, timeout: float = 600) -> dict:
    """Run the worker under torchrun with PROCESSES processes; returns the JSON object it wrote."""
    root = Path(__file__).resolve().parents[2]
    return torchrun_json(["-m", "groundup.plan.layouts", "--steps", str(steps), *(names or list(LAYOUTS))],
                         PROCESSES, timeout, pythonpath=str(root))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("layouts", nargs="*", default=[], help=f"of {', '.join(LAYOUTS)} (default: every one)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--json-out", default="")
    p.add_argument("--launch", action="store_true", help="start torchrun and print the JSON")
    args = p.parse_args(argv)
    names = args.layouts or list(LAYOUTS)
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        p.error(f"unknown layout {unknown[0]!r}: expected one of {', '.join(LAYOUTS)}")
    if args.launch:
        print(json.dumps(launch(names, args.steps), indent=2))
        return 0
    worker(names, Path(args.json_out), args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
