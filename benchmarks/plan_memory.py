"""`groundup plan`'s memory model against measured peak tensor memory: 2 CPU processes (gloo).

    python benchmarks/plan_memory.py            # DDP and FSDP2 full shard: fp32 with accumulation 1
                                                # and 2, with and without checkpointing; and bf16-weights
                                                # (FSDP's MixedPrecisionPolicy): one JSON object
    python benchmarks/plan_memory.py --quick    # fp32: DDP with 2 accumulation steps, FSDP2 with 1 and 2
                                                # (the test's run)

The script launches itself under torchrun with 2 processes. Each process builds the model, sets up
groundup's precision (train.precision.Precision) and wraps the model with groundup.train.distributed
(`init_distributed`, `wrap`, `grad_sync`, `total_norm`), builds groundup's optimizers and runs
optimizer steps in the order groundup's training step takes them: micro-batches with gradient sync
only on the last, fp32 master gradients, global-norm clipping, the step, zero_grad.
The peak of live tensor bytes per process comes from the profiler's allocation events
(groundup.plan.measure); the first step is left out of the peak (AdamW makes its state there),
so the peak is the steady state the plan predicts. Tensor parallelism is not measured: groundup
has no TP yet.

Model: d_model 256, 4 layers, 4 heads (2 KV heads), SwiGLU 768, vocab 8192, untied; 4 x 256 tokens
per micro-batch; AdamW (fused). bf16 scenarios: d_model 128, 2 layers, vocab 2048, 4 x 128 tokens,
on torch's bf16 kernels (slow on a CPU without bf16 instructions, but they keep what a GPU keeps).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = ["model.vocab_size=8192", "model.d_model=256", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=2",
         "model.max_seq_len=256", "model.tie_embeddings=false", "model.name=plan-check"]
RUN = ["train.batch_size=4", "train.seq_len=256", "train.device=cpu", "distributed.backend=gloo", "optim.name=adamw",
       "precision.cpu_bf16_matmul=native"]
# bf16 runs through torch's own bf16 kernels (what a GPU keeps; groundup's default CPU emulation upcasts),
# about 1 GFLOP/s on a CPU without bf16 instructions: a smaller model and batch for those.
SMALL = ["model.vocab_size=2048", "model.d_model=128", "model.n_layers=2", "train.seq_len=128"]


def scenario(strategy: str, accum: int, ckpt: bool, precision: str = "fp32", extra: tuple = ()) -> dict:
    return {"strategy": strategy, "grad_accum": accum, "grad_checkpointing": ckpt, "precision": precision,
            "overrides": list(extra)}


FULL = [scenario(s, a, c) for c in (False, True) for a in (1, 2) for s in ("ddp", "fsdp")] + [
    scenario("ddp", 2, False, "bf16-weights", SMALL), scenario("fsdp", 2, True, "bf16-weights", SMALL)]
QUICK = [scenario("ddp", 2, False), scenario("fsdp", 1, False), scenario("fsdp", 2, False)]


def scenario_config(sc: dict, extra: list[str]):
    from groundup.config import load_config
    from groundup.train.config import TrainConfig

    return load_config(TrainConfig, None, [
        *MODEL, *RUN, f"distributed.strategy={sc['strategy']}", f"train.grad_accum={sc['grad_accum']}",
        f"train.grad_checkpointing={str(sc['grad_checkpointing']).lower()}", f"precision.mode={sc['precision']}",
        *sc["overrides"], *extra])


def _local_bytes(t) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def measure(cfg, d, steps: int) -> dict:
    """Run `steps` optimizer steps in the order groundup's step takes them; the peak of live tensor bytes."""
    import torch

    from groundup.model import Transformer
    from groundup.plan.measure import span, track_peak
    from groundup.train.distributed import grad_sync, total_norm, wrap
    from groundup.train.optimizers import build_optimizers
    from groundup.train.precision import Precision

    B, T, A = cfg.train.batch_size, cfg.train.seq_len, cfg.train.grad_accum
    gen = torch.Generator().manual_seed(1 + d.rank)
    batches = [torch.randint(0, cfg.model.vocab_size, (B, T + 1), generator=gen) for _ in range(steps * A)]
    torch.manual_seed(cfg.train.seed)
    gc.collect()
    parts: dict[str, float] = {}
    with track_peak() as peak:
        with span("build"):
            model = Transformer(cfg.model)
            model.grad_checkpointing = cfg.train.grad_checkpointing
            precision = Precision(cfg.precision, d.device, fsdp=d.strategy == "fsdp")
            compute = precision.setup(model)
            wrapped = wrap(compute, d, precision.fsdp_policy(), find_unused=cfg.model.n_experts > 0)
            optimizers = build_optimizers(precision.master, cfg.optim)
        for step in range(steps):
            with span(f"step{step}"):
                for i in range(A):
                    tokens = batches[step * A + i]
                    with grad_sync(wrapped, d, i == A - 1):
                        with span(f"forward{step}.{i}"), precision.context():
                            out = wrapped(tokens[:, :-1], tokens[:, 1:])
                        with span(f"backward{step}.{i}"):
                            (out.loss / A).backward()
                    del out
                if precision.split:
                    precision.grads_to_master()
                params = [p for p in precision.master.parameters() if p.grad is not None]
                norm = total_norm([p.grad for p in params])
                coef = min(1.0, cfg.optim.grad_clip / (norm + 1e-6)) if cfg.optim.grad_clip else 1.0
                if step == steps - 1:
                    parts["gradients"] = sum(_local_bytes(p.grad) for p in params)
                with span(f"optimizer{step}"):
                    if coef < 1.0:
                        for p in params:
                            p.grad.mul_(coef)
                    for opt in optimizers:
                        opt.step()
                    precision.master_to_compute()
                    precision.zero_grad()
        parts["weights"] = sum(_local_bytes(p) for p in compute.parameters())
        parts["master_weights"] = (sum(_local_bytes(p) for p in precision.master.parameters())
                                   if precision.split else 0)
        parts["optimizer"] = sum(_local_bytes(v) for opt in optimizers for state in opt.state.values()
                                 for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
        del wrapped, model, compute, optimizers, params, precision
    steady = max(peak.marks[f"step{s}"] for s in range(1, steps))
    last = f"{steps - 1}.{A - 1}"  # the last micro-batch of the last step
    phases = {"forward": peak.marks[f"forward{last}"], "backward": peak.marks[f"backward{last}"],
              "optimizer": peak.marks[f"optimizer{steps - 1}"]}
    return {"phases": phases, "peak": steady, "peak_first_step": peak.marks["step0"], "method": peak.method,
            "inferred_free_bytes": peak.inferred_free_bytes, **parts}


def predicted_phases(memory, accum: int) -> dict[str, float]:
    """The plan's largest moment in the forward, the backward (last micro-batch) and the optimizer step."""
    last = [m for m in memory.moments if accum == 1 or "(micro-batch: last)" in m.name]
    forward = max(m.total for m in last if "forward" in m.name)
    backward = max(m.total for m in last if "backward" in m.name)
    optimizer = max(m.total for m in memory.moments if m.name == "optimizer step")
    return {"forward": forward, "backward": backward, "optimizer": optimizer}


def accumulation_cost(results: list[dict]) -> dict:
    """What a second micro-batch costs under FSDP (fp32, no checkpointing): one shard of the fp32
    gradient, since groundup reduce-scatters every micro-batch (distributed.fsdp_grad_sync = "every")."""
    def find(accum):
        return next((r for r in results if r["strategy"] == "fsdp" and r["grad_accum"] == accum
                     and r["precision"] == "fp32" and not r["grad_checkpointing"]), None)

    one, two = find(1), find(2)
    if one is None or two is None:
        return {}
    full = one["parts"]["weights"]["measured"] * 2  # fp32 weights of the whole model (2 shards)
    return {"measured_extra_bytes": two["measured_peak"] - one["measured_peak"],
            "predicted_extra_bytes": two["predicted_peak"] - one["predicted_peak"],
            "unsharded_fp32_gradient_bytes": full, "sharded_fp32_gradient_bytes": full / 2}


def worker(args) -> None:
    import torch

    from groundup.plan import predict_memory
    from groundup.train.distributed import init_distributed

    from groundup.plan.measure import process_wide_accounting

    process_wide_accounting()  # from the start, so that the allocator's size table knows every block
    torch.set_num_threads(1)
    scenarios = QUICK if args.quick else FULL
    results, d = [], None
    for sc in scenarios:
        cfg = scenario_config(sc, args.overrides)
        d = init_distributed(cfg)
        start = time.perf_counter()
        measured = d.gather(measure(cfg, d, args.steps))
        predicted = predict_memory(cfg, sc["strategy"], d.world_size, device="cpu", mode=sc["precision"])
        step_moment = next(m for m in predicted.moments if m.name == "optimizer step")
        phases = predicted_phases(predicted, sc["grad_accum"])
        worst = max(measured, key=lambda m: m["peak"])
        results.append({
            **sc, "predicted_peak": predicted.peak, "measured_peak": worst["peak"],
            "measured_peak_per_rank": [m["peak"] for m in measured],
            "ratio": predicted.peak / worst["peak"], "predicted_phase": predicted.phase,
            "parts": {k: {"predicted": step_moment.parts[k], "measured": worst[k]}
                      for k in ("weights", "master_weights", "optimizer", "gradients")},
            "phases": {k: {"predicted": v, "measured": worst["phases"][k], "ratio": v / worst["phases"][k]}
                       for k, v in phases.items()},
            "predicted_peak_parts": predicted.parts,
            "seconds": time.perf_counter() - start, "method": worst["method"],
        })
    if d is not None and d.is_main:
        out = {"model": dict(o.split("=", 1) for o in MODEL + RUN), "world_size": d.world_size,
               "steps": args.steps,
               "method": "peak of live tensor bytes from torch.profiler allocation events (groundup.plan.measure); "
                         "the first step left out",
               "tensor_parallel": "not measured: groundup has no tensor parallelism yet",
               "results": results, "max_abs_error": max(abs(r["ratio"] - 1) for r in results)}
        out["fsdp_accumulation"] = accumulation_cost(results)
        Path(args.json_out).write_text(json.dumps(out, indent=2))
    if d is not None:
        d.close()


def launch(quick: bool = False, steps: int = 2, timeout: float = 600, overrides: list[str] | tuple = ()) -> dict:
    """Run the worker under torchrun with 2 processes; returns the JSON object it wrote."""
    from groundup.plan.measure import torchrun_json

    return torchrun_json([str(Path(__file__).resolve()), "--worker", "--steps", str(steps),
                          *(["--quick"] if quick else []), *overrides], 2, timeout, pythonpath=str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="DDP and FSDP2 with 2 accumulation steps only")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps (the first is left out of the peak)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json-out", default="", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="section.key=value over the benchmark's TrainConfig")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2 (the first step is left out)")
    if args.worker:
        worker(args)
        return 0
    print(json.dumps(launch(args.quick, args.steps, args.timeout, args.overrides), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
