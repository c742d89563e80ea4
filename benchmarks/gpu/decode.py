"""Part 4 of the GPU check: decoding tokens/s, groundup's engine against transformers `generate`.

    python benchmarks/gpu/decode.py --out DIR [--quick] [--new-tokens N] [--repeat R] [--budget-s S]

The model is a ~124M-parameter Llama shape (vocab 32768, d_model 768, 12 layers, 12 heads, 4 KV heads,
FFN 2048, untied), randomly initialised, in bfloat16; --quick runs a tiny one (d_model 128, 2 layers)
in float32 on the CPU. As in benchmarks/decode.py (whose functions this reuses), the model is exported
with `groundup export hf` and loaded by AutoModelForCausalLM, so both sides hold the same weights, and
each side greedily decodes --new-tokens tokens after a random prompt with no early stop. For batch 1,
8 and 64 the sides are:

    groundup               the engine (Generator), eager decode step
    groundup_compiled      the engine with its torch.compile'd decode step (CUDA only: a CPU compile
                           takes 20-90 s; tests/test_infer_compile.py covers it)
    transformers           `generate`, dynamic cache, sdpa attention
    transformers_static    `generate` with cache_implementation="static": on CUDA transformers then
                           compiles the forward itself (torch.compile, mode reduce-overhead: CUDA graphs)

Every side is called once outside the timings (compiling; its seconds are `first_call_s`), the two
compiled ones once more on CUDA (CUDA graphs are recorded after the compile), then the sides run
interleaved for --repeat rounds and the median is kept. Greedy tokens are compared with `transformers`'
(the share of identical rows and the mean tokens before rows part: bfloat16 rounds differently in each
implementation, so paths part at near-ties, transformers' two paths too; reported, not failed; in
float32, --quick, they must agree). The goal: at batch 1, our best side at least 1.5x transformers' best.

Then the weight-only kernels: each quantized matmul (QuantLinear, int8 per channel and int4 in groups
of 128, the backend `auto` picks: on CUDA aten's _weight_int8pack_mm / tinygemm _weight_int4pack_mm)
against bf16 F.linear, at 1 and 8 rows, for this model's FFN shapes and a 7B-class layer's; and
decoding through the engine (eager) with int8 and int4 RTN copies of the model against bfloat16.
(--quick: the `dequant` backend, so no kernel is built or compiled on the CPU.)

Stages run in order of importance (kernels, batch 1, int8/int4 decode at batch 1, batch 8, ..., 64) while
--budget-s lasts: one expected to end past it is skipped with a note. Each is guarded (a failure is a
note) and the JSON is written after every stage, so a hard time limit leaves a partial result whose
notes say so. On an H100 with a cold compile cache (2026-11-27, torch 2.11, transformers 5.17) the
default 100 s covers setup (~25 s), kernels and batch 1 (~60 s: compiling is ~32 s ours, ~13 s
transformers'); the first batch above 1 compiles both again (~35 s each); --budget-s 300 covers
everything (~170 s with a warm cache, ~230 s cold).
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_for, goal, parse_args, peak_memory_gib, timed, write_result  # noqa: E402

from benchmarks.decode import cold, first_difference, hf_greedy, race, save_for_both  # noqa: E402

FULL = dict(vocab_size=32768, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, d_ff=2048, max_seq_len=1024,
            tie_embeddings=False, init_std=0.05)  # a wider init than 0.02 keeps argmax ties rare
QUICK = dict(vocab_size=512, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256, max_seq_len=128,
             tie_embeddings=False, init_std=0.05)
BATCHES = (1, 8, 64)
GOAL = "decode batch 1 vs HF generate"
KERNEL_SHAPES = {"ffn_up (4096, 768)": (4096, 768), "ffn_down (768, 2048)": (768, 2048),
                 "7B o_proj (4096, 4096)": (4096, 4096), "7B ffn_up (14336, 4096)": (14336, 4096)}
QUICK_KERNEL_SHAPES = {"ffn_up (512, 128)": (512, 128)}


def options(p) -> None:
    p.add_argument("--new-tokens", type=int, default=None, help="tokens per row (default 64; --quick 8)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="(default 32; --quick 16)")
    p.add_argument("--repeat", type=int, default=None, help="timed rounds (default 3; --quick 2)")
    p.add_argument("--batch-sizes", default=",".join(map(str, BATCHES)))
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no stage expected to end after this many seconds (default 100; --quick 300; "
                        "300 measures everything on an H100)")


class Run:
    """The part's record, written after every stage; a failed measurement becomes a note."""

    def __init__(self, args, device: torch.device):
        self.args, self.device, self.began = args, device, time.perf_counter()
        self.budget_s = args.budget_s or (300 if args.quick else 100)
        self.deadline = self.began + self.budget_s
        quick = args.quick
        self.cfg = QUICK if quick else FULL
        self.dtype = torch.float32 if quick else torch.bfloat16
        self.n = args.new_tokens or (8 if quick else 64)
        self.prompt = args.prompt_tokens or (16 if quick else 32)
        self.repeat = args.repeat or (2 if quick else 3)
        self.gen = torch.Generator().manual_seed(1)  # the prompts
        self.work = Path(tempfile.mkdtemp(prefix="groundup-gpu-decode-"))
        self.results: dict = {"new_tokens": self.n, "prompt_tokens": self.prompt, "repeat": self.repeat,
                              "stage_seconds": {}}
        self.goals = [goal(GOAL, 1.5, None)]
        self.notes: list[str] = []

    def stage(self, name: str, fn, estimate_s: float = 0.0) -> object:
        """fn() unless it would likely end past the budget (`estimate_s`: its expected seconds)."""
        left = self.deadline - time.perf_counter()
        if left < estimate_s:
            self.notes.append(f"{name}: skipped, {max(left, 0):.0f} s of the {self.budget_s:.0f} s budget left and it "
                              f"would take about {estimate_s:.0f} s (--budget-s)")
            return None
        start = time.perf_counter()
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - one failure is a note, not a lost JSON
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.notes.append(f"{name} failed: {type(e).__name__}: {first[:300]}")
            traceback.print_exc(file=sys.stderr)
            return None
        finally:
            self.results["stage_seconds"][name] = round(time.perf_counter() - start, 1)
            self.save(final=False)

    def estimate(self, batch: int, quantized: bool = False) -> float:
        """Seconds a stage should take, from those already run (on an H100: the first batch above 1 compiles
        both compiled sides again, ~1.3x the batch 1 stage; later batches reuse those dynamic graphs)."""
        seen = self.results["stage_seconds"]
        if quantized:  # three eager sides: a first call and `repeat` runs each, at about bf16's speed
            eager = [self.results.get(f"batch_{b}", {}).get("groundup", {}).get("median_s") for b in (batch, 1)]
            known = [t * (1 if b == batch else 1.5) for t, b in zip(eager, (batch, 1)) if t]
            return 3 * (self.repeat + 1) * known[0] + 5 if known else 0.0
        if batch == 1 or "batch 1" not in seen:
            return 0.0
        return seen["batch 1"] * (0.5 if any(k.startswith("batch ") and k != "batch 1" for k in seen) else 1.3)

    def save(self, final: bool = True) -> dict:
        self.results["peak_memory_gib"] = peak_memory_gib(self.device)
        notes = self.notes if final else [*self.notes, "partial: written before the run had finished"]
        quiet = contextlib.nullcontext() if final else contextlib.redirect_stdout(io.StringIO())
        with quiet:
            return write_result(self.args.out, "decode", self.device, self.args.quick, self.began, self.results,
                                self.goals, notes)


def clock(device: torch.device):
    """benchmarks/decode.py's clock, the device's queue drained around each call (common.timed)."""
    def run(fn):
        box = []
        return timed(lambda: box.append(fn()), device), box[0]
    return run


def measure(run: Run, sides: dict, batch: int, n: int, reference: str, compiled=()) -> dict:
    """First call (compiling) of each side, guarded (a failing side is a note), a second one for the
    `compiled` sides on CUDA (CUDA graphs are recorded after the compile); then the survivors raced."""
    first, live = {}, {}
    for name, fn in sides.items():
        try:
            first[name] = timed(fn, run.device)
            if name in compiled and run.device.type == "cuda":
                fn()
            live[name] = fn
        except Exception as e:  # noqa: BLE001
            run.notes.append(f"batch {batch}, {name} failed: {type(e).__name__}: {str(e).strip()[:300]}")
            traceback.print_exc(file=sys.stderr)
    times, tokens, _ = race(live, run.repeat, clock(run.device), warmups=0)
    out = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        out[name] = {"tokens_per_s": round(batch * n / median, 1), "median_s": round(median, 4),
                     "runs_s": [round(t, 4) for t in ts], "first_call_s": round(first[name], 2)}
        if name != reference and reference in tokens:
            diffs = [first_difference(a, b) for a, b in zip(tokens[name], tokens[reference])]
            out[name][f"identical_rows_vs_{reference}"] = round(sum(d is None for d in diffs) / len(diffs), 3)
            out[name]["mean_tokens_before_difference"] = round(statistics.mean(n if d is None else d for d in diffs), 1)
            out[name]["first_difference_per_row"] = diffs[:8]
    return out


def decode_batch(run: Run, batch: int, engines: dict, hf) -> dict:
    n, device = run.n, run.device
    prompts = torch.randint(2, run.cfg["vocab_size"], (batch, run.prompt), generator=run.gen)
    rows, on_device = prompts.tolist(), prompts.to(device)
    sides = {name: (lambda g=g: cold(g, rows, n)) for name, g in engines.items()}
    sides["transformers"] = lambda: hf_greedy(hf, on_device, n)
    sides["transformers_static"] = lambda: hf_greedy(hf, on_device, n, cache_implementation="static")
    with torch.inference_mode():
        out = measure(run, sides, batch, n, reference="transformers",
                      compiled=("groundup_compiled", "transformers_static"))
    if "transformers_static" in out:
        out["transformers_static"]["compiled"] = hasattr(hf, "_compiled_call")
    ours = [v["tokens_per_s"] for k, v in out.items() if k.startswith("groundup")]
    theirs = [v["tokens_per_s"] for k, v in out.items() if k.startswith("transformers")]
    if ours and theirs:
        out["ours_best_vs_transformers_best"] = round(max(ours) / max(theirs), 2)
    run.results[f"batch_{batch}"] = out
    return out


def kernels_bench(run: Run) -> dict:
    """Per call of a quantized matmul (QuantLinear, backend `auto`) against F.linear in the model's dtype."""
    import torch.nn.functional as F

    from groundup.quant import kernels
    from groundup.quant.modules import QuantLinear
    from groundup.quant.units import cast_scales

    device, dtype = run.device, run.dtype
    shapes = QUICK_KERNEL_SHAPES if run.args.quick else KERNEL_SHAPES
    iters = 10 if run.args.quick else 200
    out = {"backend": kernels.backend_for(device), "iters": iters}
    g = torch.Generator().manual_seed(2)
    for label, (N, K) in shapes.items():
        lin = torch.nn.Linear(K, N, bias=False)
        lin.weight.data.copy_(torch.randn(N, K, generator=g) * 0.02)
        lin = lin.to(device, dtype)
        mods = {"int8": cast_scales(QuantLinear.from_linear(lin, "int8"), lin.weight),  # as quantize_model
                "int4": cast_scales(QuantLinear.from_linear(lin, "int4", 128), lin.weight)}
        for rows in (1, 8):
            x = torch.randn(rows, K, generator=g).to(device, dtype)
            impls = {"float": lambda: F.linear(x, lin.weight)} | {k: (lambda m=m: m(x)) for k, m in mods.items()}
            entry = {}
            with torch.inference_mode():
                for name, fn in impls.items():
                    fn()
                    fn()  # warm up: the packed kernels convert their weights on first use
                    per_call = timed(lambda: [fn() for _ in range(iters)], device) / iters
                    entry[name] = {"us": round(per_call * 1e6, 2)}
                    if name in mods:
                        ref = F.linear(x.float(), mods[name].dequantize(torch.float32))
                        err = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
                        entry[name]["max_rel_err_vs_dequantized"] = float(f"{err:.2e}")
            for name in mods:
                entry[name]["speed_vs_float"] = round(entry["float"]["us"] / entry[name]["us"], 2)
            out[f"{label} x{rows}"] = entry
    run.results["kernels"] = out
    return out


def quant_decode(run: Run, batch: int, model, tok, quantized: dict) -> dict:
    """Greedy decoding through the engine (eager): the model against its int8 and int4 RTN copies."""
    from groundup.infer import Generator

    n = run.n
    prompts = torch.randint(2, run.cfg["vocab_size"], (batch, run.prompt), generator=run.gen).tolist()
    name = "bfloat16" if run.dtype == torch.bfloat16 else "float32"
    gens = {name: Generator(model, tok)} | {k: Generator(m, tok) for k, m in quantized.items()}
    sides = {k: (lambda g=g: cold(g, prompts, n)) for k, g in gens.items()}
    with torch.inference_mode():
        out = measure(run, sides, batch, n, reference=name)
    for k in quantized:
        if k in out and name in out:
            out[k]["speed_vs_" + name] = round(out[k]["tokens_per_s"] / out[name]["tokens_per_s"], 2)
    run.results.setdefault("quantized_decode", {})[f"batch_{batch}"] = out
    return out


def quantize_copies(run: Run, model) -> dict:
    from groundup.quant import quantize_model

    out = {}
    for fmt in ("int8", "int4"):
        m = copy.deepcopy(model)
        quantize_model(m, fmt)  # RTN; int4 in groups of 128; scales in the model's dtype
        out[fmt] = m.eval()
    return out


def setup(run: Run):
    import transformers

    from groundup.config import from_dict
    from groundup.corpus import iter_shakespeare
    from groundup.infer import Generator
    from groundup.model import ModelConfig, Transformer
    from groundup.tokenizer import TokenizerConfig, train_tokenizer

    # A tokenizer as large as the model's vocabulary (the engine samples among the tokenizer's ids only), so
    # both sides choose among the same ids; 32768 merges from all of Shakespeare take ~3 s. Prompts are random ids.
    works = itertools.islice(iter_shakespeare(), 2 if run.args.quick else None)
    texts = [w["text"][:50_000] if run.args.quick else w["text"] for w in works]
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=run.cfg["vocab_size"]), progress=False)
    torch.manual_seed(0)
    model = Transformer(from_dict(ModelConfig, run.cfg)).eval().to(run.dtype)
    model.reset_buffers()  # RoPE tables stay float32, as after loading
    hf_dir = save_for_both(model, tok, run.work)  # saved from the CPU
    model.to(run.device)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=run.dtype, attn_implementation="sdpa")
    hf = hf.to(run.device).eval()
    engines = {"groundup": Generator(model, tok)}
    if run.device.type == "cuda":
        engines["groundup_compiled"] = Generator(model, tok, compile=True)
    else:
        run.notes.append("--quick: no groundup_compiled side (a CPU compile takes 20-90 s; "
                         "tests/test_infer_compile.py covers it); transformers compiles only on CUDA, so "
                         "transformers_static runs its static cache uncompiled")
    run.results["model"] = {**run.cfg, "parameters": sum(p.numel() for p in model.parameters()),
                            "dtype": str(run.dtype).removeprefix("torch.")}
    run.results["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    return model, tok, hf, engines


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], extra=options)
    device = device_for(args.quick)
    run = Run(args, device)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    if args.quick:
        torch.set_num_threads(min(2, torch.get_num_threads()))
        from groundup.quant import set_kernel_backend

        set_kernel_backend("dequant")
        run.notes.append("--quick: quantized matmuls use the `dequant` backend (no CPU kernel built or "
                         "compiled); benchmarks/quant_kernels.py measures the CPU kernels")
    try:
        ready = run.stage("setup", lambda: setup(run))
        if ready is None:
            return 1
        model, tok, hf, engines = ready
        run.stage("kernels", lambda: kernels_bench(run), estimate_s=5)
        quantized = None
        for batch in batches:  # in order of importance: batch 1 (the goal) before the rest
            out = run.stage(f"batch {batch}", lambda b=batch: decode_batch(run, b, engines, hf), run.estimate(batch))
            if batch == 1:
                run.goals = [goal(GOAL, 1.5, (out or {}).get("ours_best_vs_transformers_best"))]
            if quantized is None:
                quantized = run.stage("quantize", lambda: quantize_copies(run, model), estimate_s=5) or {}
            if quantized:
                run.stage(f"quantized batch {batch}", lambda b=batch: quant_decode(run, b, model, tok, quantized),
                          run.estimate(batch, quantized=True))
        return 0
    finally:
        run.save(final=True)
        shutil.rmtree(run.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
