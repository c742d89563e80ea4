"""Training throughput: our training step against Hugging Face LlamaForCausalLM, in one process.

    python benchmarks/train_throughput.py                       # fp32 and bf16, JSON on stdout
    python benchmarks/train_throughput.py --modes fp32 --steps 7 --compile

Same model on both sides (the issue's config): vocab 8192, d_model 384, 6 layers, 6 heads, 2 KV heads,
SwiGLU FFN 1024, untied embeddings; random tokens, batch 8 x 256. Each side runs what its users run:
- ours: `groundup.train.step.train_step`, the loop's own step (data gate, fused linear + cross-entropy,
  global-norm clipping, fused AdamW, spike guard), at each precision mode;
- Hugging Face: forward with labels, backward, clip_grad_norm_(1.0), AdamW(fused=True) (the Trainer's
  default optimizer for torch >= 2.8); bf16 is torch.autocast on the CPU, as the Trainer's bf16=True.
Steps of all variants are interleaved (one step of each in turn) so that load from other processes on
a shared machine hits all of them alike; `ratio` is the median over rounds of the per-round speed-up,
`ratio_best` compares the fastest step of each side. MFU is model FLOPs per token
(6N + attention) x tokens/s of the fastest step / the fastest fp32 matmul rate measured before each
round at the FFN's shape (bf16 rows also give it against the bf16 rate, which on a CPU without bf16
instructions is far lower).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from groundup.config import from_dict  # noqa: E402
from groundup.tokens.loader import Batch  # noqa: E402
from groundup.model.sizing import flops_per_token  # noqa: E402
from groundup.train.config import TrainConfig  # noqa: E402
from groundup.train.distributed import Dist  # noqa: E402
from groundup.train.peak import measure_matmul_flops  # noqa: E402
from groundup.train.precision import cpu_has_native_bf16  # noqa: E402
from groundup.train.objective import NextTokenObjective  # noqa: E402
from groundup.train.state import build_state  # noqa: E402
from groundup.train.step import train_step  # noqa: E402

MODEL = dict(vocab_size=8192, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2, d_ff=1024, max_seq_len=256,
             tie_embeddings=False)
BATCH, SEQ = 8, 256


class RandomTokens:
    """An endless loader of uniformly random token windows (the benchmark's data)."""

    def __init__(self, seed: int = 0):
        self.gen = torch.Generator().manual_seed(seed)

    def __next__(self) -> Batch:
        x = torch.randint(0, MODEL["vocab_size"], (BATCH, SEQ + 1), generator=self.gen)
        return Batch(x[:, :-1], x[:, 1:], [[0]] * BATCH, ["random"] * BATCH)

    def document_names(self, docs):
        return [str(d) for d in docs]


def ours(precision: str, cpu_bf16_matmul: str = "auto", compile: bool = False):
    cfg = from_dict(TrainConfig, {
        "model": {"name": "bench", **MODEL}, "train": {"batch_size": BATCH, "seq_len": SEQ, "compile": compile},
        "precision": {"mode": precision, "cpu_bf16_matmul": cpu_bf16_matmul},
        "schedule": {"warmup_steps": 0}, "stability": {"spike_factor": 0.0}})
    state = build_state(cfg, Dist(), NextTokenObjective(cfg), RandomTokens())

    def step():
        r = train_step(state)
        state.step += 1
        return r.loss

    return step, cfg.model


def hugging_face(bf16: bool, compile: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=MODEL["vocab_size"], hidden_size=MODEL["d_model"], num_hidden_layers=MODEL["n_layers"],
        num_attention_heads=MODEL["n_heads"], num_key_value_heads=MODEL["n_kv_heads"],
        intermediate_size=MODEL["d_ff"], max_position_embeddings=SEQ, tie_word_embeddings=False,
        attn_implementation="sdpa"))
    model.train()
    forward = torch.compile(model) if compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    data = RandomTokens()

    def step():
        batch = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = forward(input_ids=batch.inputs, labels=batch.inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def measure(variants: dict, steps: int, warmup: int, rate_probe) -> tuple[dict, dict, list[float]]:
    """Wall and CPU seconds per step of each variant, and the matmul rate, all interleaved by round."""
    for name, fn in variants.items():
        began = time.perf_counter()
        for _ in range(warmup):
            fn()
        print(f"  warmed up {name} in {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    rates = []
    for i in range(steps):
        rates.append(rate_probe())  # the matmul rate under this round's load, for MFU
        for name, fn in variants.items():
            began, began_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - began)
            cpu[name].append(time.process_time() - began_cpu)
        print(f"  round {i + 1}/{steps}: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in wall.items()),
              file=sys.stderr, flush=True)
    return wall, cpu, rates


def report(wall: list[float], cpu: list[float], fpt: float, rate: float) -> dict:
    """`mfu`: the fastest step against the fastest matmul probe, both from the machine's quietest moments."""
    median = statistics.median(wall)
    best = BATCH * SEQ / min(wall)
    return {"tokens_per_sec": round(BATCH * SEQ / median, 1), "tokens_per_sec_best": round(best, 1),
            "step_s_median": round(median, 3), "cpu_s_median": round(statistics.median(cpu), 3),
            "step_s": [round(x, 3) for x in wall], "mfu": round(best * fpt / rate, 4)}


def ratios(wall: dict, ours: str, peer: str) -> dict:
    """Speed-up of `ours` over `peer`: per round (the two steps ran back to back under the same load),
    its median, and best step against best step. On a shared machine whose load comes and goes the
    paired median is the robust number; the medians of each side alone can pair a quiet step with a busy one."""
    per_round = [p / o for o, p in zip(wall[ours], wall[peer])]
    return {"ratio": round(statistics.median(per_round), 3), "ratio_best": round(min(wall[peer]) / min(wall[ours]), 3),
            "ratio_per_round": [round(r, 3) for r in per_round]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", default="fp32,bf16", help="comma list of fp32, bf16")
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant (fp32)")
    p.add_argument("--bf16-steps", type=int, default=3, help="timed steps per variant (bf16; slow on AVX2 CPUs)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="also time our step under torch.compile")
    p.add_argument("--no-native-bf16", action="store_true", help="skip our bf16 with torch's own bf16 kernels")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); with 1, cpu_s is "
                                                          "the work a step takes, whatever the machine's load")
    args = p.parse_args()
    torch.manual_seed(0)
    modes = args.modes.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    # The FFN's matmul shape (tokens x d_model x d_ff): the rate this model's biggest layers can reach,
    # measured before every round so that MFU sees the same load as the steps.
    shape = (BATCH * SEQ, MODEL["d_model"], MODEL["d_ff"])

    def fp32_rate():
        return measure_matmul_flops(torch.float32, seconds=0.5, shape=shape)

    rates = {"fp32": fp32_rate()}
    if "bf16" in modes:
        rates["bf16"] = measure_matmul_flops(torch.bfloat16, seconds=2.0, shape=shape)
    fpt = None
    result: dict = {
        "benchmark": "train_throughput", "config": {**MODEL, "batch": BATCH, "seq_len": SEQ, "optimizer": "AdamW"},
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "native_bf16_matmul": cpu_has_native_bf16(), "torch": torch.__version__},
    }
    if "fp32" in modes:
        step, model_cfg = ours("fp32")
        fpt = flops_per_token(model_cfg, SEQ)
        variants = {"ours": step, "hf": hugging_face(False)}
        if args.compile:  # both sides: torch.compile is one flag away for Hugging Face users too
            variants["ours_compiled"] = ours("fp32", compile=True)[0]
            variants["hf_compiled"] = hugging_face(False, compile=True)
        wall, cpu, probe = measure(variants, args.steps, args.warmup, fp32_rate)
        rates["fp32"] = max(probe)
        rows = {name: report(wall[name], cpu[name], fpt, rates["fp32"]) for name in wall}
        rows.update(ratios(wall, "ours", "hf"))
        if args.compile:
            rows["compiled"] = ratios(wall, "ours_compiled", "hf_compiled")
        result["fp32"] = rows
    if "bf16" in modes:
        step, model_cfg = ours("bf16-weights")
        fpt = fpt or flops_per_token(model_cfg, SEQ)
        variants = {"ours_bf16_weights": step, "ours_bf16_autocast": ours("bf16-autocast")[0]}
        if not args.no_native_bf16:
            variants["ours_bf16_weights_native_kernels"] = ours("bf16-weights", "native")[0]
        variants["hf"] = hugging_face(True)
        wall, cpu, probe = measure(variants, args.bf16_steps, args.warmup, fp32_rate)
        rates["fp32_bf16_rounds"] = max(probe)
        emulated = not cpu_has_native_bf16()  # our default on such CPUs: fp32 arithmetic on bf16 values
        rows = {}
        for name in wall:
            kernels = "bf16" if name == "hf" or name.endswith("native_kernels") or not emulated else "fp32"
            # MFU against the fp32 rate (the fastest this CPU multiplies) and against its bf16 rate.
            row = report(wall[name], cpu[name], fpt, rates["fp32_bf16_rounds"])
            rows[name] = {**row, "matmul_kernels": kernels,
                          "mfu_vs_bf16_matmul": round(row["mfu"] * rates["fp32_bf16_rounds"] / rates["bf16"], 3)}
        best = max((n for n in rows if n.startswith("ours") and not n.endswith("native_kernels")),
                   key=lambda n: rows[n]["tokens_per_sec"])
        rows.update(ratios(wall, best, "hf"))
        rows["ratio_of"] = best
        if "ours_bf16_weights_native_kernels" in rows:
            rows["native_kernels"] = ratios(wall, "ours_bf16_weights_native_kernels", "hf")
        result["bf16"] = rows
    result["flops_per_token"] = fpt
    result["matmul_flops"] = {k: round(v / 1e9, 2) for k, v in rates.items()}
    result["matmul_flops_unit"] = "GFLOP/s (the fastest of the per-round measurements at the FFN's shape)"
    result["machine"]["threads"] = torch.get_num_threads()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
