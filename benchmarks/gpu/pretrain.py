"""GPU check, part 2: pretraining throughput of groundup's training step against Hugging Face's Llama.

    python benchmarks/gpu/pretrain.py --out DIR [--quick] [--presets 124m,1b] [--steps 10]

Two Llama-shaped presets (pre-norm RMSNorm, SwiGLU, RoPE, GQA): `124m` (GPT-2 small class: vocab 50304,
12 x 768, 12 heads, FFN 2048, tied, sequence 1,024) and `1b` (the ladder-1b preset: vocab 32768,
20 x 2048, 16/8 heads, FFN 5632, tied, sequence 2,048). On each, the same random-token batches through:
- ours-adamw / ours-muon: `train_step`, the loop's own step (data gate, fused linear + cross-entropy,
  clipping, fused AdamW or Muon, spike guard) with bf16 autocast over fp32 weights and torch.compile;
- hf-adamw: LlamaForCausalLM of the same shape (SDPA attention), forward with labels under bf16 autocast,
  backward, clip_grad_norm_, AdamW(fused=True), the model torch.compile'd (what the Trainer does with
  bf16=True, torch_compile=True).
Variants run one after another, each built fresh (peak memory is its own), warmed up (compilation) and
then timed over --steps steps. MFU = (6N + attention) FLOPs per token x tokens/s / the GPU's dense bf16
peak (989 TFLOP/s for an H100 SXM). --quick: tiny shapes on the CPU, fp32, no compile.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from common import device_for, goal, parse_args, peak_memory_gib, sync, write_result

from groundup.config import from_dict  # noqa: E402
from groundup.model.sizing import flops_per_token, param_counts  # noqa: E402
from groundup.tokens.loader import Batch  # noqa: E402
from groundup.train.config import TrainConfig  # noqa: E402
from groundup.train.distributed import Dist  # noqa: E402
from groundup.train.peak import peak_flops  # noqa: E402
from groundup.train.objective import NextTokenObjective  # noqa: E402
from groundup.train.state import build_state  # noqa: E402
from groundup.train.step import train_step  # noqa: E402

PRESETS = {
    "124m": (dict(vocab_size=50304, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, d_ff=2048,
                  max_seq_len=1024, tie_embeddings=True), 16, 1024),  # (model, batch, sequence)
    "1b": (dict(vocab_size=32768, d_model=2048, n_layers=20, n_heads=16, n_kv_heads=8, d_ff=5632,
                max_seq_len=2048, rope_theta=500000.0, tie_embeddings=True), 8, 2048),
    "quick": (dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192, max_seq_len=64,
                   tie_embeddings=True), 2, 64),
}
GOAL_MFU = {"124m": 0.45, "1b": 0.50}
GOAL_VS_HF = 1.2


class RandomTokens:
    """Endless uniformly random token windows on the CPU (the loop moves them to the device)."""

    def __init__(self, vocab: int, batch: int, seq: int, seed: int = 0):
        self.vocab, self.batch, self.seq = vocab, batch, seq
        self.gen = torch.Generator().manual_seed(seed)

    def __next__(self) -> Batch:
        x = torch.randint(0, self.vocab, (self.batch, self.seq + 1), generator=self.gen)
        return Batch(x[:, :-1], x[:, 1:], [[0]] * self.batch, ["random"] * self.batch)

    def document_names(self, docs):
        return [str(d) for d in docs]


def ours(model: dict, batch: int, seq: int, device: torch.device, optimizer: str, compile: bool, bf16: bool):
    cfg = from_dict(TrainConfig, {
        "model": {"name": "bench", **model},
        "train": {"batch_size": batch, "seq_len": seq, "compile": compile, "device": device.type},
        "optim": {"name": optimizer}, "precision": {"mode": "bf16-autocast" if bf16 else "fp32"},
        "schedule": {"warmup_steps": 0}, "stability": {"spike_factor": 0.0}})
    state = build_state(cfg, Dist(device=device), NextTokenObjective(cfg), RandomTokens(model["vocab_size"], batch, seq))

    def step():
        train_step(state)
        state.step += 1

    return step


def hugging_face(model: dict, batch: int, seq: int, device: torch.device, compile: bool, bf16: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=model["vocab_size"], hidden_size=model["d_model"], num_hidden_layers=model["n_layers"],
        num_attention_heads=model["n_heads"], num_key_value_heads=model["n_kv_heads"],
        intermediate_size=model["d_ff"], max_position_embeddings=seq, tie_word_embeddings=model["tie_embeddings"],
        rope_theta=model.get("rope_theta", 10000.0), attn_implementation="sdpa")).to(device)
    hf.train()
    forward = torch.compile(hf) if compile else hf
    opt = torch.optim.AdamW(hf.parameters(), lr=3e-4, weight_decay=0.1, fused=device.type == "cuda")
    data = RandomTokens(model["vocab_size"], batch, seq)

    def step():
        ids = next(data).inputs.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run_variant(build, device: torch.device, warmup: int, steps: int, profile: bool = False) -> dict:
    """Build, warm up (compilation), then time `steps` steps one by one (each drained, so the median is a
    step's real time; the total over all steps, drained once, gives tokens/s without the per-step syncs)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    step = build()
    for _ in range(warmup):
        step()
    sync(device)
    warm_s = time.perf_counter() - began
    each = []
    for _ in range(steps):
        sync(device)
        t = time.perf_counter()
        step()
        sync(device)
        each.append(time.perf_counter() - t)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    total = time.perf_counter() - t
    record = {"build_and_warmup_s": round(warm_s, 1), "step_s_median": round(statistics.median(each), 4),
              "step_s_min": round(min(each), 4), "step_s_pipelined": round(total / steps, 4),
              "peak_memory_gib": peak_memory_gib(device)}
    if profile and device.type == "cuda":
        try:
            record["profile"] = profile_steps(step, total / steps)
        except Exception as e:  # noqa: BLE001 - the numbers above stand without it
            record["profile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    del step
    return record


def profile_steps(step, step_s: float, n: int = 3) -> dict:
    """Where a step's time goes: the top kernels by GPU time, how busy the GPU was (kernel time over the
    step's wall time: the rest is the host making it wait), and torch.compile's graph breaks."""
    from torch._dynamo.utils import counters
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    kernel_s = sum(e.device_time_total for e in events) / 1e6 / n
    top = sorted(events, key=lambda e: -e.device_time_total)[:12]
    return {"gpu_busy": round(kernel_s / step_s, 3), "kernel_ms_per_step": round(kernel_s * 1e3, 2),
            "top_kernels": [{"name": e.key[:90], "ms_per_step": round(e.device_time_total / 1e3 / n, 2),
                             "calls_per_step": e.count // n} for e in top],
            "graph_breaks": sum(counters["graph_break"].values()),
            "unique_graphs": counters["stats"].get("unique_graphs", 0)}


def measure_preset(name: str, device: torch.device, quick: bool, steps: int, warmup: int, optimizers: list[str],
                   deadline: float, result: dict, notes: list[str], save) -> None:
    """Fill `result` with the preset's variants, calling `save()` after each (a later hang or kill keeps
    what was measured)."""
    model, batch, seq = PRESETS[name]
    compile, bf16 = not quick, not quick
    tokens = batch * seq
    from groundup.model.config import ModelConfig

    mcfg = from_dict(ModelConfig, {"name": name, **model})
    fpt = flops_per_token(mcfg, seq)
    found = peak_flops(device, torch.bfloat16 if bf16 else torch.float32)
    peak, source = found.flops, found.source
    build_ours = {f"ours-{o}": (lambda o=o: ours(model, batch, seq, device, o, compile, bf16)) for o in optimizers}
    variants = {"ours-adamw": build_ours.pop("ours-adamw")} if "ours-adamw" in build_ours else {}
    variants["hf-adamw"] = lambda: hugging_face(model, batch, seq, device, compile, bf16)
    variants |= build_ours  # Muon last: the variant dropped first when time runs short
    rows: dict[str, dict] = {}
    result |= {"params": param_counts(mcfg)["params_total"], "batch": batch, "seq_len": seq, "flops_per_token": fpt,
               "peak_flops": peak, "peak_source": source, "compile": compile, "bf16": bf16, "variants": rows}
    longest = 0.0
    for vname, build in variants.items():
        left = deadline - time.perf_counter()
        if left < 1.3 * longest or left < 5:
            notes.append(f"{name}/{vname} skipped: {left:.0f} s left of the budget, a variant took {longest:.0f} s")
            continue
        began = time.perf_counter()
        try:
            r = run_variant(build, device, warmup, steps, profile=vname != "ours-muon")
        except Exception as e:  # noqa: BLE001 - one variant failing leaves the others' numbers
            notes.append(f"{name}/{vname} failed: {type(e).__name__}: {str(e)[:500]}")
            save()
            continue
        longest = max(longest, time.perf_counter() - began)
        best = min(r["step_s_pipelined"], r["step_s_median"])
        r["tokens_per_s"] = round(tokens / best, 1)
        r["mfu"] = round(tokens / best * fpt / peak, 4)
        rows[vname] = r
        if "ours-adamw" in rows and "hf-adamw" in rows:
            result["speedup_vs_hf"] = round(rows["ours-adamw"]["tokens_per_s"] / rows["hf-adamw"]["tokens_per_s"], 3)
        print(f"  {name} {vname}: {r}", flush=True)
        save()


def goals_of(results: dict) -> list[dict]:
    goals = []
    for name, target in GOAL_MFU.items():
        if name in results:
            row = results[name].get("variants", {}).get("ours-adamw")
            goals.append(goal(f"MFU {name} (ours, AdamW)", target, row and row["mfu"]))
            goals.append(goal(f"training step {name} vs HF Llama compiled", GOAL_VS_HF,
                              results[name].get("speedup_vs_hf")))
    return goals


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--presets", default="124m,1b"), p.add_argument("--steps", type=int, default=10),
        p.add_argument("--warmup", type=int, default=3), p.add_argument("--optimizers", default="adamw,muon"),
        p.add_argument("--budget-s", type=float, default=300.0, help="variants that would not fit are skipped")))
    began = time.perf_counter()
    device = device_for(args.quick)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    presets = ["quick"] if args.quick else args.presets.split(",")
    steps, warmup = (2, 1) if args.quick else (args.steps, args.warmup)
    results: dict[str, dict] = {}
    notes: list[str] = []

    def save():
        write_result(args.out, "pretrain", device, args.quick, began, results, goals_of(results), notes, echo=False)

    for name in presets:
        results[name] = {}
        try:
            measure_preset(name, device, args.quick, steps, warmup, args.optimizers.split(","),
                           began + args.budget_s, results[name], notes, save)
        except Exception as e:  # noqa: BLE001
            notes.append(f"{name} failed: {type(e).__name__}: {str(e)[:500]}")
    write_result(args.out, "pretrain", device, args.quick, began, results, goals_of(results), notes)


if __name__ == "__main__":
    main()
