"""The README's quantization table: size, held-out bits per byte and greedy decoding speed of groundup's
fp32, int8, int4-g128 and GPTQ-int4-g128 models beside torchao's int8 and int4 weight-only, one run.

    .venv/bin/python benchmarks/quant_table.py [--rounds 5] [--threads 1] [--compile] [--models demo,100m] [--quick]

Models: the demo model (groundup/demo/config.py DEMO_MODEL; the trained checkpoint of --demo-run when it
has one, else random weights, said in the output) and the 100M ladder shape (ladder-100m with vocab 8192:
d_model 640, 16 layers, 10/5 heads, FFN 1792, tied; random weights, which is enough for speed).

Per model and format:
- size: bytes of model.safetensors as `groundup quantize` writes it (torchao: torch.save of its state dict);
- bits per byte on the val split of --tokens (the demo's token shards; `eval/perplexity.evaluate`, the
  definition training reports; the first --bpb-batches batches of 8 x 128 tokens per domain, 1 for the
  100M model), else on held-out text the script tokenizes; the delta from fp32 in %. (Random weights give
  near-uniform predictions: their bpb deltas measure quantization noise only.) torchao's int4 on the
  100M model is left out: its CPU kernel runs a 1,024-token batch ~70x slower than fp32 F.linear here.
- greedy decoding tokens/s at batch 1 and 8 (prompts of 16 val tokens, 96 new tokens for the demo model,
  32 for the 100M one, no early stop) through groundup's eager engine, and with --compile also
  Generator(compile=True) (the decode step compiled, weights frozen; ~1 min per engine and batch size).
  Engines run interleaved in --rounds rounds and the best round counts (the machine is shared); an
  engine whose warm-up run took over 10 s is timed once. GPTQ-int4 runs int4's kernels, so its
  compiled speed is int4's (not compiled again).
- a profile of the eager decode step at batch 1 (torch.profiler): the share of time in weight
  matmuls, which bounds what faster matmuls can give (Amdahl).
The goals the issue sets are evaluated at the end. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from groundup.config import from_dict  # noqa: E402
from groundup.infer import Generator  # noqa: E402
from groundup.model import ModelConfig, Transformer  # noqa: E402
from groundup.quant import native, quantize_model  # noqa: E402

LADDER_100M = {"preset": "ladder-100m", "vocab_size": 8192, "max_seq_len": 512}
OURS = ("fp32", "int8", "int4-g128", "gptq-int4-g128")
TORCHAO = ("torchao-int8", "torchao-int4-g128")


# ----------------------------------------------------------------------------- models and data


def demo_model(run: Path, tokens: Path):
    """(model, tokenizer, description): the trained demo checkpoint, else random weights."""
    from groundup.demo.config import DEMO_MODEL
    from groundup.layout import find_tokenizer_dir, resolve_model_dir
    from groundup.quant.load import load_model
    from groundup.tokenizer import load_tokenizer

    try:
        model_dir = resolve_model_dir(run, note=lambda *_: None)
        tok_dir = find_tokenizer_dir(model_dir)
        model = load_model(model_dir).eval()
        tok = load_tokenizer(tok_dir)
        return model, tok, f"trained checkpoint {model_dir}"
    except Exception as e:  # noqa: BLE001 - no run yet: random weights, said so
        why = f"{type(e).__name__}: {e}"
    tok = fallback_tokenizer(tokens)
    cfg = from_dict(ModelConfig, {**DEMO_MODEL, "vocab_size": tok.vocab_size})
    torch.manual_seed(0)
    return Transformer(cfg).eval(), tok, f"random weights (no trained checkpoint: {why})"


def fallback_tokenizer(tokens: Path):
    from groundup.tokenizer import load_tokenizer

    index = tokens / "index.json"
    if index.is_file():
        return load_tokenizer(json.loads(index.read_text())["tokenizer"])
    import itertools

    from groundup.corpus import iter_shakespeare
    from groundup.tokenizer import TokenizerConfig, train_tokenizer

    texts = [w["text"][:200_000] for w in itertools.islice(iter_shakespeare(), 4)]
    return train_tokenizer(texts, TokenizerConfig(vocab_size=4096), progress=False)


def heldout(tok, tokens: Path, n_rows: int, seq_len: int) -> tuple[list[list[int]], list[list[int]]]:
    """(calibration rows from the train split, prompt rows from the val split) of the shards or of text."""
    if (tokens / "index.json").is_file():
        from groundup.tokens.loader import TokenLoader

        def rows(split, n):
            loader = TokenLoader(tokens, split, seq_len, 8, expected_tokenizer_hash=tok.hash)
            out = []
            for batch in loader.eval_batches():
                out += [r for r in batch.inputs.tolist() if min(r) >= 0]
                if len(out) >= n:
                    break
            return out[:n]
        return rows("train", n_rows), rows("val", 8)
    import itertools

    from groundup.corpus import iter_shakespeare

    text = " ".join(w["text"] for w in itertools.islice(iter_shakespeare(), 6, 8))
    ids = tok.encode(text)
    chunks = [ids[i : i + seq_len] for i in range(0, len(ids) - seq_len, seq_len)]
    return chunks[8 : 8 + n_rows], chunks[:8]


def bits_per_byte(model, tok, tokens: Path, seq_len: int, max_batches: int | None, text_rows) -> dict:
    if (tokens / "index.json").is_file():
        from groundup.eval.perplexity import evaluate

        r = evaluate(model, tokens, "val", seq_len=seq_len, batch_size=8, max_batches=max_batches, tokenizer=tok)
        return {"bpb": r["bpb"], "tokens": r["tokens"]}
    token_bytes = torch.from_numpy(tok.token_bytes().astype("int64"))
    nll = nbytes = n = 0.0
    with torch.no_grad():
        for i in range(0, len(text_rows), 8):
            x = torch.tensor(text_rows[i : i + 8])
            logits = model(x[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum")
            nll, nbytes, n = nll + float(loss), nbytes + float(token_bytes[x[:, 1:]].sum()), n + x[:, 1:].numel()
    return {"bpb": nll / nbytes / 0.6931471805599453, "tokens": int(n)}


def variants(base, calibration: list[list[int]], skip_torchao: bool) -> tuple[dict, dict, dict]:
    """({name: model}, {name: seconds to make}, {name: why it is missing})."""
    made, seconds, missing = {"fp32": base}, {}, {}
    for name, method, options in (("int8", "int8", {}), ("int4-g128", "int4", {"group_size": 128}),
                                  ("gptq-int4-g128", "gptq", {"bits": 4, "group_size": 128, "act_order": True,
                                                              "calibration": [torch.tensor(r) for r in calibration]})):
        m = copy.deepcopy(base)
        t = time.perf_counter()
        quantize_model(m, method, **options)
        made[name], seconds[name] = m.eval(), round(time.perf_counter() - t, 1)
    if skip_torchao:
        return made, seconds, {n: "--no-torchao" for n in TORCHAO}
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
    except Exception as e:  # noqa: BLE001
        return made, seconds, {n: f"{type(e).__name__}: {e}" for n in TORCHAO}
    blocks_only = lambda mod, fqn: isinstance(mod, torch.nn.Linear) and fqn.startswith("blocks.")  # noqa: E731
    for name, config in (("torchao-int8", Int8WeightOnlyConfig()),
                         ("torchao-int4-g128", PrototypeInt4WeightOnlyConfig(group_size=128, set_inductor_config=False))):
        m = copy.deepcopy(base)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quantize_(m, config, filter_fn=blocks_only)
            made[name] = m.eval()
        except Exception as e:  # noqa: BLE001
            missing[name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return made, seconds, missing


def size_bytes(name: str, model) -> int:
    from groundup.model.model_dir import save_model
    from groundup.quant import save_quantized_model

    if name.startswith("torchao"):
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        return buf.tell()
    with tempfile.TemporaryDirectory() as d:
        (save_model if name == "fp32" else save_quantized_model)(model, d)
        return (Path(d) / "model.safetensors").stat().st_size


# ----------------------------------------------------------------------------- speed


def compiled_constants() -> dict[int, torch.Tensor]:
    """Every tensor inductor's generated modules hold (frozen weights and folded constants), by id."""
    from torch._inductor.codecache import PyCodeCache

    modules = PyCodeCache.modules if isinstance(PyCodeCache.modules, list) else list(PyCodeCache.modules.values())
    return {id(v): v for mod in modules for v in vars(mod).values() if isinstance(v, torch.Tensor)}


def constants_mb(new: list[torch.Tensor]) -> dict:
    """MB of the matrices a compiled graph holds, float and integer: whether weights stayed integers."""
    mats = [t for t in new if t.dim() == 2 and t.numel() >= 4096]
    size = lambda ts: round(sum(t.numel() * t.element_size() for t in ts) / 1e6, 2)  # noqa: E731
    return {"float_mb": size([t for t in mats if t.is_floating_point()]),
            "integer_mb": size([t for t in mats if not t.is_floating_point()])}


def decode_speed(models: dict, tok, prompts: list[list[int]], new_tokens: int, rounds: int, compile: bool) -> dict:
    """{name: {"b1": tokens/s, "b8": tokens/s} or {"error": ...}} with engines interleaved per round."""
    out: dict[str, dict] = {name: {} for name in models}
    for batch in (1, 8):
        rows = prompts[:batch]
        runs = {}
        for name, m in models.items():
            try:
                before = compiled_constants() if compile else {}
                gen = Generator(m, tok, compile=compile)
                t = time.perf_counter()
                gen.generate_ids(rows, max_new_tokens=new_tokens, temperature=0, stop_ids=())  # compile, warm up
                out[name][f"warmup_b{batch}_s"] = round(time.perf_counter() - t, 1)
                if compile and batch == 1:
                    out[name]["graph_constants"] = constants_mb([v for k, v in compiled_constants().items()
                                                                 if k not in before])
                runs[name] = gen
            except Exception as e:  # noqa: BLE001 - e.g. a torchao layout inductor cannot compile
                out[name]["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        best = {name: float("inf") for name in runs}
        for r in range(rounds):
            for name, gen in runs.items():
                if r and out[name][f"warmup_b{batch}_s"] > 10:  # a slow engine: timed once
                    continue
                t = time.perf_counter()
                gen.generate_ids(rows, max_new_tokens=new_tokens, temperature=0, stop_ids=())
                best[name] = min(best[name], time.perf_counter() - t)
        for name, t in best.items():
            out[name][f"b{batch}"] = round(batch * new_tokens / t, 1)
    return out


MATMUL_OPS = ("aten::mm", "aten::addmm", "groundup_quant::int8_mm", "groundup_quant::int4_mm")


def profile_step(model, tok, prompt: list[int], steps: int = 24) -> dict:
    """Share of the eager batch-1 decode's CPU time in weight matmuls, and the top ops."""
    from torch.profiler import ProfilerActivity, profile

    gen = Generator(model, tok)
    gen.generate_ids([prompt], max_new_tokens=4, temperature=0, stop_ids=())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        gen.generate_ids([prompt], max_new_tokens=steps, temperature=0, stop_ids=())
    events = [(e.key, e.self_cpu_time_total) for e in prof.key_averages()]
    total = sum(t for _, t in events) or 1.0
    matmul = sum(t for k, t in events if k in MATMUL_OPS)
    top = sorted(events, key=lambda e: -e[1])[:6]
    return {"matmul_share": round(matmul / total, 3), "ms_per_token": round(total / 1000 / steps, 3),
            "top_ops": {k: round(t / total, 3) for k, t in top}}


# ----------------------------------------------------------------------------- one model


def measure(label: str, model, tok, description: str, args, bpb_batches: int | None, new_tokens: int) -> dict:
    seq_len = min(128, model.cfg.max_seq_len)
    calibration, prompts = heldout(tok, args.tokens, args.calibration_rows, seq_len)
    prompts = [p[:16] for p in prompts]
    log(f"[{label}] quantizing ({len(calibration)} calibration rows of {seq_len} tokens for GPTQ)")
    models, seconds, missing = variants(model, calibration, args.no_torchao)
    rows: dict[str, dict] = {name: {"quantize_s": seconds.get(name)} for name in models}
    text_rows = calibration if not (args.tokens / "index.json").is_file() else None
    for name, m in models.items():
        rows[name]["size_mb"] = round(size_bytes(name, m) / 1e6, 2)
        if name == "torchao-int4-g128" and label == "100m":
            rows[name]["bpb"] = None
            rows[name]["bpb_skipped"] = "its CPU kernel runs 8 x 128-token batches ~70x slower than fp32 F.linear"
            continue
        t = time.perf_counter()
        rows[name].update(bits_per_byte(m, tok, args.tokens, seq_len, bpb_batches, text_rows))
        log(f"[{label}] {name}: {rows[name]['size_mb']} MB, bpb {rows[name]['bpb']:.4f} ({time.perf_counter() - t:.0f}s)")
    fp32 = rows["fp32"]["bpb"]
    for r in rows.values():
        if r["bpb"] is not None:
            r["bpb_delta_pct"] = round(100 * (r["bpb"] - fp32) / fp32, 3)
            r["bpb"] = round(r["bpb"], 4)
    log(f"[{label}] eager decoding")
    speeds = {"eager": decode_speed(models, tok, prompts, new_tokens, args.rounds, compile=False)}
    if args.compile:
        log(f"[{label}] compiled decoding (compiling each engine once per batch size)")
        compiled = {n: m for n, m in models.items() if n != "gptq-int4-g128"}
        speeds["compiled"] = decode_speed(compiled, tok, prompts, new_tokens, args.rounds, compile=True)
        speeds["compiled"]["gptq-int4-g128"] = {"same_kernels_as": "int4-g128"}
    base = speeds["eager"]["fp32"]
    for name in models:
        rows[name]["decode_tokens_per_s"] = {mode: s.get(name, {}) for mode, s in speeds.items()}
        rows[name]["speed_vs_fp32_eager"] = {
            mode: {b: round(s[name][b] / base[b], 2) for b in ("b1", "b8") if b in s.get(name, {}) and b in base}
            for mode, s in speeds.items()}
    log(f"[{label}] profiling the eager decode step")
    profile = {name: profile_step(models[name], tok, prompts[0]) for name in ("fp32", "int8", "int4-g128")}
    return {"model": description, "config": {k: getattr(model.cfg, k) for k in (
                "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "tie_embeddings")},
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "bpb_on": (f"val split of {args.tokens}" + (f" (first {bpb_batches} batches of 8 x {seq_len} per domain)"
                                                        if bpb_batches else "")) if text_rows is None
            else "held-out Shakespeare text tokenized here",
            "new_tokens": new_tokens, "prompt_tokens": 16, "formats": rows, "missing": missing,
            "eager_decode_profile_b1": profile, "goals": goals(rows)}


def goals(rows: dict) -> dict:
    def speed(name, mode="eager", b="b1"):
        return rows.get(name, {}).get("speed_vs_fp32_eager", {}).get(mode, {}).get(b)

    def delta(name):
        return rows.get(name, {}).get("bpb_delta_pct")

    out = {"int8_bpb_within_0.5pct": abs(delta("int8")) <= 0.5,
           "gptq_int4_closer_than_rtn_int4": abs(delta("gptq-int4-g128")) < abs(delta("int4-g128")),
           "int8_b1_eager_ge_1.5x": (speed("int8") or 0) >= 1.5, "int4_b1_eager_ge_2x": (speed("int4-g128") or 0) >= 2.0}
    if speed("int8", "compiled") is not None:
        out["int8_b1_compiled_ge_1.5x"] = speed("int8", "compiled") >= 1.5
        out["int4_b1_compiled_ge_2x"] = (speed("int4-g128", "compiled") or 0) >= 2.0
    for ours, theirs in (("int8", "torchao-int8"), ("int4-g128", "torchao-int4-g128")):
        if theirs not in rows:
            continue
        for mode in ("eager", "compiled"):
            for b in ("b1", "b8"):
                a, t = speed(ours, mode, b), speed(theirs, mode, b)
                if a is not None and t is not None:
                    out[f"{ours}_{b}_{mode}_ge_{theirs}"] = a >= t
        if delta(theirs) is None:
            continue
        # "no worse" within the measurement's resolution: 0.01 percentage points of bpb
        out[f"{ours}_bpb_no_worse_than_{theirs}_within_0.01pp"] = delta(ours) <= delta(theirs) + 0.01
        if ours == "int4-g128":
            out[f"gptq-int4-g128_bpb_no_worse_than_{theirs}"] = delta("gptq-int4-g128") <= delta(theirs)
    return out


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--demo-run", type=Path, default=Path("/work/exp/base/run"), help="the demo's training run")
    p.add_argument("--tokens", type=Path, default=Path("/work/exp/base/tokens"), help="the demo's token shards")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calibration-rows", type=int, default=64, help="GPTQ calibration rows (of 128 tokens)")
    p.add_argument("--compile", action="store_true", help="also compiled decoding (adds ~1 min per engine)")
    p.add_argument("--models", default="demo,100m", help="demo, 100m or both")
    p.add_argument("--bpb-batches", type=int, default=8, help="demo model: val batches per domain for bpb")
    p.add_argument("--no-torchao", action="store_true")
    p.add_argument("--quick", action="store_true", help="the demo model only, 2 rounds (a smoke run)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    # Every engine compiles the same decode step for its own model: without a higher limit, dynamo would
    # stop compiling after 8 of them and silently run the rest eagerly.
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    t0 = time.perf_counter()
    out = {"benchmark": "quant_table", "command": " ".join(["python", *sys.argv]),
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": args.threads,
                       "load_before": os.getloadavg()[0], "torch": torch.__version__,
                       "torchao": _version("torchao")},
           "kernels": {"native": native.available(), "native_unavailable": native.why_unavailable()},
           "models": {}}
    if args.quick:
        args.rounds = 2
    out["machine"]["threads_why"] = ("torch.set_num_threads(1): the machine is shared (other jobs, load 2-8), "
                                     "and one thread gives stable ratios between engines run interleaved")
    wanted = {"demo"} if args.quick else set(args.models.split(","))
    demo, tok, description = demo_model(args.demo_run, args.tokens)
    if "demo" in wanted:
        out["models"]["demo"] = measure("demo", demo, tok, description, args, args.bpb_batches, 96)
    if "100m" in wanted:
        torch.manual_seed(0)
        big = Transformer(from_dict(ModelConfig, dict(LADDER_100M))).eval()
        out["models"]["ladder-100m-vocab8192"] = measure("100m", big, tok, "random weights (init_std 0.02)", args,
                                                         1, 32)
    out["machine"]["load_after"] = os.getloadavg()[0]
    out["seconds"] = round(time.perf_counter() - t0)
    print(json.dumps(out, indent=1))
    return 0


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    raise SystemExit(main())
