"""What a quantized model's kernels cost at first use: seconds from a fresh process to its first decoded
tokens, per kernel backend, with cold and warm caches, beside fp32.

    .venv/bin/python benchmarks/quant_first_use.py [--run /work/exp/base/run] [--threads 1] [--repeats 2]

The model is the demo's (the trained checkpoint of --run), written once as fp32, int8 and int4-g128
model directories. Each measurement is a fresh Python process
that imports groundup, loads one directory through `load_model`, and then, as the demo's report card does
(demo/scorecard.py), decodes greedily through the engine: a warm-up of 4 tokens after a short prompt
(the first decode: this is the number the complaint was about), a 100-token prompt (prefill past the
decode kernels' row limit), then 64 tokens at batch 1 (steady tokens/s).

Backends (groundup.quant.kernels): `auto` (what every verb runs), `native` (the C++ kernels of
quant/native.py, built once per machine into torch's extension cache), `compiled` (torch.compile'd
multiply-reduce, compiled again in every process; inductor's on-disk cache makes later processes
cheaper), `packed` (PyTorch's _weight_int8pack_mm / _weight_int4pack_mm_for_cpu: no warm-up),
`dequant` (dequantize, then F.linear: no warm-up). "cold": fresh, empty TORCHINDUCTOR_CACHE_DIR and
TORCH_EXTENSIONS_DIR (a first run on a new machine); "warm": the same directories again (every later
run). Prints one JSON object; the best of --repeats warm processes counts.

Measured 2026-11-23 (2-core AMD EPYC, one thread, load 4-13), the demo model in int8: first decode
26-45 s cold and 4.8-5.3 s warm with `compiled` (the default before the native kernels), 15-16 s cold
(the build, once per machine) and 0.15 s warm with `native`; int4's 100-token prompt took 6-27 s more
while it went through a compiled dequantize, 0.03 s through the native one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
torch.set_num_threads(int(sys.argv[3]))
from groundup.infer import Generator
from groundup.quant.load import load_model
from groundup.quant import set_kernel_backend
from groundup.tokenizer import load_tokenizer
t_import = time.perf_counter()
set_kernel_backend(sys.argv[2])
model = load_model(sys.argv[1]).eval()
tok = load_tokenizer(sys.argv[1] + "/tokenizer")
t_load = time.perf_counter()
gen = Generator(model, tok)
prompt = [list(tok.prefix_ids) + tok.encode("ROMEO.\n")]
gen.complete_ids(prompt, max_new_tokens=4, temperature=0)
t_first = time.perf_counter()
long = [list(tok.prefix_ids) + tok.encode("To be, or not to be, that is the question: " * 12)[:100]]
gen.complete_ids(long, max_new_tokens=4, temperature=0)
t_prefill = time.perf_counter()
with torch.no_grad():
    t = time.perf_counter()
    out = gen.generate_ids(prompt, max_new_tokens=64, temperature=0, stop_ids=())
    speed = 64 / (time.perf_counter() - t)
from groundup.quant import kernels
print(json.dumps({"import_s": t_import - t0, "load_s": t_load - t_import, "first_decode_s": t_first - t_load,
                  "long_prompt_s": t_prefill - t_first, "to_first_tokens_s": t_first - t0,
                  "tokens_per_s_b1": speed, "resolved": kernels.backend_for(torch.device("cpu"))}))
"""


def child(model_dir: Path, backend: str, threads: int, caches: Path | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    if caches is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(caches / "inductor")
        env["TORCH_EXTENSIONS_DIR"] = str(caches / "extensions")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, str(model_dir), backend, str(threads)], env=env,
                       capture_output=True, text=True)
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["process_s"] = time.perf_counter() - t
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}


def make_models(run: Path, root: Path) -> str:
    from groundup.layout import find_tokenizer_dir, resolve_model_dir
    from groundup.model.model_dir import save_model
    from groundup.quant.load import load_model
    from groundup.quant import quantize_model, save_quantized_model
    from groundup.tokenizer import load_tokenizer

    try:
        src = resolve_model_dir(run, note=lambda *_: None)
        model, tok = load_model(src), load_tokenizer(find_tokenizer_dir(src))
    except Exception as e:  # noqa: BLE001
        raise SystemExit(f"--run {run}: {e} (run `groundup demo` first, or pass another model)") from None
    save_model(model, root / "fp32")
    tok.save(root / "fp32" / "tokenizer")
    for name, method, options in (("int8", "int8", {}), ("int4-g128", "int4", {"group_size": 128})):
        m = load_model(root / "fp32")
        quantize_model(m, method, **options)
        save_quantized_model(m, root / name)
        tok.save(root / name / "tokenizer")
    return f"trained checkpoint {src} ({model.cfg.d_model} wide, {model.cfg.n_layers} layers)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", type=Path, default=Path("/work/exp/base/run"), help="the demo's training run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="warm processes per case (the best counts)")
    p.add_argument("--backends", default="auto,native,compiled,packed,dequant")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    out = {"benchmark": "quant_first_use", "command": " ".join(["python", *sys.argv]),
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "threads": args.threads, "load_before": os.getloadavg()[0]}, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out["model"] = make_models(args.run, root / "models")
        cases = [("fp32", "auto")] + [(f, b) for f in ("int8", "int4-g128") for b in args.backends.split(",")]
        for fmt, backend in cases:
            name = f"{fmt}.{backend}" if fmt != "fp32" else "fp32"
            caches = root / f"caches-{name}"
            print(f"{name} ...", file=sys.stderr, flush=True)
            cold = child(root / "models" / fmt, backend, args.threads, caches)
            warm = [child(root / "models" / fmt, backend, args.threads, caches) for _ in range(args.repeats)]
            ok = [w for w in warm if "error" not in w]
            best = min(ok, key=lambda w: w["to_first_tokens_s"]) if ok else warm[0]
            if ok:
                best["tokens_per_s_b1"] = max(w["tokens_per_s_b1"] for w in ok)
            out["cases"][name] = {"cold": cold, "warm": best}
    out["machine"]["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
