"""Quantized matmul kernels: groundup's int8 / int4 paths against fp32 F.linear and torchao.

    .venv/bin/python benchmarks/quant_kernels.py [--threads 1] [--rounds 7] [--group-size 128]

For the four matmuls of a transformer block (qkv, o, gate_up, down) of a d_model 384 model
(FFN 1024) and a d_model 768 model (FFN 2048), at 1 and 8 rows (batch 1 and 8 decoding), on the
same random weights:

    fp32            F.linear
    int8/int4.X     groundup.quant.kernels through a QuantLinear, backend X: `compiled` (what
                    `auto` runs on CPU: torch.compile'd multiply-reduce up to kernels.SMALL_ROWS
                    rows, F.linear over a one-pass float copy above), `packed` (PyTorch's
                    _weight_int8pack_mm / _weight_int4pack_mm_for_cpu), `dequant` (eager
                    dequantize + F.linear)
    torchao.int8    torchao Int8WeightOnlyConfig (per-row int8)
    torchao.int4    torchao PrototypeInt4WeightOnlyConfig (groups, tinygemm CPU kernel)

The machine is shared, so every implementation runs interleaved with the others in each round
and the time kept is the minimum over rounds of the mean per call. Prints one JSON object: per
layer the microseconds per call and each one's speed relative to fp32; per model the sum over a
block's four matmuls as tokens/s (rows / time); which implementation `auto` uses; and (unless
--decode-tokens 0) greedy decoding tokens/s through the engine for fp32, int8 and int4 copies of
benchmarks/decode.py's d_model 384 model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from groundup.quant import kernels  # noqa: E402
from groundup.quant.modules import QuantLinear  # noqa: E402

MODELS = {"d384": (384, 1024), "d768": (768, 2048)}
ROWS = (1, 8)


def layers(d: int, ffn: int) -> dict[str, tuple[int, int]]:
    return {"qkv": (3 * d, d), "o": (d, d), "gate_up": (2 * ffn, d), "down": (d, ffn)}


def torchao_linear(w: torch.Tensor, kind: str, group_size: int):
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data.copy_(w)
    config = Int8WeightOnlyConfig() if kind == "int8" else PrototypeInt4WeightOnlyConfig(
        group_size=group_size, set_inductor_config=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_(lin, config)
    return lin.eval(), None


def per_call(fn, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--min-seconds", type=float, default=0.02, help="time per implementation per round")
    p.add_argument("--decode-tokens", type=int, default=64,
                   help="also time greedy decoding of this many tokens through the engine (0 = skip)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    g = args.group_size
    results, notes = [], {}
    models: dict[str, dict] = {}
    with torch.inference_mode():
        for model_name, (d, ffn) in MODELS.items():
            for layer, (N, K) in layers(d, ffn).items():
                w = torch.randn(N, K) * 0.02
                lin = torch.nn.Linear(K, N, bias=False)
                lin.weight.data.copy_(w)
                q8 = QuantLinear.from_linear(lin, "int8")
                q4 = QuantLinear.from_linear(lin, "int4", g)
                ao8, why8 = torchao_linear(w, "int8", g)
                ao4, why4 = torchao_linear(w, "int4", g)
                for why, name in ((why8, "torchao.int8"), (why4, "torchao.int4")):
                    if why:
                        notes[name] = why
                for rows in ROWS:
                    x = torch.randn(rows, K)
                    impls = {"fp32": lambda: F.linear(x, w)}
                    for backend in ("compiled", "packed", "dequant"):
                        for fmt, mod in (("int8", q8), ("int4", q4)):
                            def run(mod=mod, backend=backend):
                                previous = kernels.set_kernel_backend(backend)
                                try:
                                    return mod(x)
                                finally:
                                    kernels.set_kernel_backend(previous)
                            impls[f"{fmt}.{backend}"] = run
                    if ao8 is not None:
                        impls["torchao.int8"] = lambda: ao8(x)
                    if ao4 is not None:
                        impls["torchao.int4"] = lambda: ao4(x)
                    ref8 = F.linear(x, q8.dequantize())
                    ref4 = F.linear(x, q4.dequantize())
                    errors, iters = {}, {}
                    for name, fn in impls.items():  # warm up (compile), check, size the loops
                        fn()
                        y = fn()
                        ref = ref8 if "int8" in name else ref4 if "int4" in name else None
                        if ref is not None:
                            errors[name] = float((y.float() - ref).abs().max() / ref.abs().max())
                        t = per_call(fn, 3)
                        iters[name] = max(3, int(args.min_seconds / max(t, 1e-7)))
                    best = {name: float("inf") for name in impls}
                    for _ in range(args.rounds):
                        for name, fn in impls.items():
                            best[name] = min(best[name], per_call(fn, iters[name]))
                    us = {name: round(t * 1e6, 1) for name, t in best.items()}
                    results.append({"model": model_name, "layer": layer, "shape": [N, K], "rows": rows, "us": us,
                                    "speed_vs_fp32": {n: round(best["fp32"] / t, 2) for n, t in best.items() if n != "fp32"},
                                    "max_rel_err_vs_dequantized": {n: float(f"{e:.2e}") for n, e in errors.items()}})
                    entry = models.setdefault(model_name, {}).setdefault(f"rows_{rows}", {})
                    for name, t in best.items():
                        entry[name] = entry.get(name, 0.0) + t
    summary = {}
    for model_name, per_rows in models.items():
        for key, totals in per_rows.items():
            rows = int(key.split("_")[1])
            fp32 = totals["fp32"]
            summary.setdefault(model_name, {})[key] = {
                name: {"us_per_block": round(t * 1e6, 1), "tokens_per_s": round(rows / t),
                       "speed_vs_fp32": round(fp32 / t, 2)} for name, t in totals.items()}
            auto = {fmt: totals[f"{fmt}.compiled"] for fmt in ("int8", "int4")}
            for fmt, name in (("int8", "torchao.int8"), ("int4", "torchao.int4")):
                if name in totals:
                    summary[model_name][key][f"{fmt}.auto_vs_torchao"] = round(totals[name] / auto[fmt], 2)
    out = {
        "benchmark": "quant_kernels",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "threads": args.threads, "torch": torch.__version__,
                    "torchao": _version("torchao")},
        "group_size": g,
        "timing": f"min over {args.rounds} interleaved rounds of the mean per call",
        "auto_paths_cpu": {
            "int8": f"rows <= {kernels.SMALL_ROWS}: compiled multiply-reduce over int8 weights; more rows: F.linear "
                    "over the weight converted to the activations' dtype, scales on the output",
            "int4": f"rows <= {kernels.SMALL_ROWS}: compiled multiply-reduce over packed int4 (group sums); more "
                    "rows: compiled dequantize + F.linear"},
        "auto_paths_cuda": {"int8": f"rows <= {kernels.SMALL_ROWS}: aten._weight_int8pack_mm; more rows: cuBLAS "
                                    "over the dequantized weight",
                            "int4": "aten._weight_int4pack_mm (tinygemm, bf16 activations)"},
        "per_block": summary,
        "per_layer": results,
        "notes": notes,
    }
    if args.decode_tokens:
        out["decode"] = decode(max(3, args.rounds // 2), args.decode_tokens)
    print(json.dumps(out, indent=1))
    return 0


DECODE_CONFIG = dict(vocab_size=8192, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2, d_ff=1024, max_seq_len=1024,
                     tie_embeddings=False, init_std=0.05)  # benchmarks/decode.py's model


def decode(rounds: int, new_tokens: int) -> dict:
    """Greedy decoding through groundup's engine (eager): fp32 against int8 and int4 (RTN) copies."""
    from groundup.config import from_dict
    from groundup.infer import Generator
    from groundup.model import ModelConfig, Transformer
    from groundup.quant import quantize_model

    cfg = from_dict(ModelConfig, DECODE_CONFIG)
    torch.manual_seed(0)
    base = Transformer(cfg).eval()
    models = {"fp32": base}
    for method in ("int8", "int4"):
        m = Transformer(cfg).eval()
        m.load_state_dict(base.state_dict())
        quantize_model(m, method)
        models[method] = m

    import itertools

    from groundup.corpus import iter_shakespeare
    from groundup.tokenizer import TokenizerConfig, train_tokenizer

    texts = [w["text"][:50_000] for w in itertools.islice(iter_shakespeare(), 2)]
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=512), progress=False)  # decoding ids needs one

    out = {"model": "d_model 384, 6 layers, vocab 8192, untied (benchmarks/decode.py's)", "new_tokens": new_tokens,
           "prompt_tokens": 32}
    for batch in (1, 8):
        prompts = torch.randint(2, cfg.vocab_size, (batch, 32), generator=torch.Generator().manual_seed(1)).tolist()
        gens = {name: Generator(m, tok) for name, m in models.items()}
        run = {name: (lambda g=g: g.generate_ids(prompts, max_new_tokens=new_tokens, temperature=0, stop_ids=()))
               for name, g in gens.items()}
        for fn in run.values():
            fn()  # compile, warm up
        times = {name: float("inf") for name in run}
        for _ in range(rounds):
            for name, fn in run.items():
                start = time.perf_counter()
                fn()
                times[name] = min(times[name], time.perf_counter() - start)
        out[f"batch_{batch}"] = {name: {"tokens_per_s": round(batch * new_tokens / t, 1),
                                        "speed_vs_fp32": round(times["fp32"] / t, 2)} for name, t in times.items()}
    return out


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    raise SystemExit(main())
