"""Part 5 of the GPU check: `groundup serve` on the GPU under load at concurrency 1, 16 and 64.

    python benchmarks/gpu/serve.py --out DIR [--quick] [--requests 8 64 192] [--output-tokens 128] [--compile]

The server and its clients are benchmarks/serve_load.py's: a randomly initialised model with a BPE
trained on Shakespeare, `python -m groundup serve` as a subprocess on loopback (here on CUDA, bfloat16,
--max-batch 64 and a KV pool of 64 full contexts), clients with httpx and asyncio. The model is a
124M-class Llama shape (vocab 8192, d_model 768, 12 layers, 12 heads, 4 KV heads, FFN 2048, context 1024).

Each level sends its own set of streamed completions (prompts of 16..128 random token ids, a fresh set
per level so the prefix cache does not serve one level the prompts of another; `ignore_eos` and a fixed
--output-tokens, so every response has exactly that many tokens): aggregate completion tokens/s (all
completion tokens / the level's wall time), p50/p99 time to first token (client side), errors and
incomplete responses (finish_reason, usage and [DONE] checked), and from the server's /metrics the
level's decode steps, tokens per step and milliseconds per step. Goals: tokens/s at concurrency 64 at
least 10x concurrency 1; no errors or incomplete responses.

--quick: the CPU, a tiny model, concurrency 1, 4 and 8 (8 stands in for 64), a few short requests.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import serve_load  # noqa: E402
from benchmarks.gpu.common import device_for, goal, parse_args, write_result  # noqa: E402

FULL = dict(vocab_size=8192, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, d_ff=2048, max_seq_len=1024,
            tie_embeddings=False, init_std=0.02)
QUICK = {**serve_load.CONFIG, "vocab_size": 512, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
         "d_ff": 128, "max_seq_len": 256}
PROMPTS, QUICK_PROMPTS = (16, 32, 64, 128), (8, 16)
LEVELS, QUICK_LEVELS = (1, 16, 64), (1, 4, 8)
REQUESTS, QUICK_REQUESTS = (8, 64, 192), (3, 8, 16)
MAX_BATCH, QUICK_MAX_BATCH = 64, 8
BLOCK = 16  # the server's KV block size in tokens


def extra_args(p) -> None:
    p.add_argument("--requests", type=int, nargs=3, default=None, metavar="N",
                   help=f"requests at each level (default: {' '.join(map(str, REQUESTS))}; quick: "
                        f"{' '.join(map(str, QUICK_REQUESTS))})")
    p.add_argument("--output-tokens", type=int, default=None, help="tokens per response (default: 128; quick: 16)")
    p.add_argument("--greedy", action="store_true",
                   help="every request at temperature 0 (default: serve_load's mix, half greedy, half at 0.8)")
    p.add_argument("--compile", action="store_true",
                   help="pass --compile to the server, if `groundup serve` has it (default: eager decode)")


def serve_has_compile() -> bool:
    """Whether `groundup serve --help` lists --compile (a compiled decode step)."""
    try:
        out = subprocess.run([sys.executable, "-m", "groundup", "serve", "--help"], capture_output=True, text=True,
                             timeout=60, cwd=serve_load.REPO)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--compile" in out.stdout


def level_requests(n: int, concurrency: int, vocab: int, prompts: tuple, output_tokens: int,
                   greedy: bool) -> list[dict]:
    """`n` streamed completions of random token ids, each generating exactly `output_tokens`."""
    out = serve_load.make_requests(n, 1000 + concurrency, min(2048, vocab), [], chat_share=0.0, stream_share=1.0,
                                   prompts=prompts, outputs=(output_tokens,))
    for req in out if greedy else ():
        req["body"]["temperature"] = 0
    return out


def measure(url: str, requests: list[dict], concurrency: int) -> dict:
    """serve_load's run_load at `concurrency`, plus the server's decode steps over the same time."""
    before = serve_load.scrape_metrics(url)
    out = asyncio.run(serve_load.run_load(url, requests, concurrency))
    after = serve_load.scrape_metrics(url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    steps = delta("groundup_decode_steps_total")
    out["decode_steps"] = int(steps)
    out["tokens_per_step"] = round(delta("vllm:generation_tokens_total") / steps, 2) if steps else None
    out["ms_per_step"] = round(1000 * out["wall_s"] / steps, 2) if steps else None
    out["preemptions"] = int(delta("vllm:num_preemptions_total"))
    return out


def log_tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def main() -> int:
    began = time.perf_counter()
    args = parse_args(__doc__.splitlines()[0], extra_args)
    device = device_for(args.quick)
    # the driver's time limit may end this process with SIGTERM: unwind, so the server is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    quick = args.quick
    config = QUICK if quick else FULL
    levels = QUICK_LEVELS if quick else LEVELS
    counts = args.requests or (QUICK_REQUESTS if quick else REQUESTS)
    output_tokens = args.output_tokens or (16 if quick else 128)
    prompts = QUICK_PROMPTS if quick else PROMPTS
    max_batch = QUICK_MAX_BATCH if quick else MAX_BATCH
    kv_blocks = max_batch * (math.ceil(config["max_seq_len"] / BLOCK) + 1)  # every row can fill the context
    dtype = "float32" if quick else "bfloat16"
    compiled = False
    notes: list[str] = []
    if args.compile:
        compiled = serve_has_compile()
        if not compiled:
            notes.append("--compile asked for, but `groundup serve` has no --compile: the decode ran eagerly")
    else:
        notes.append("eager decode (`groundup serve` has " + ("" if serve_has_compile() else "no ") +
                     "--compile; not used)")
    if quick:
        notes.append(f"quick: the CPU, concurrency {levels[-1]} stands in for 64; the speed goal is for the GPU")
    # --grace 5: a server told to stop (or orphaned: it gets SIGTERM) does not linger on dropped requests
    extra = ["--dtype", dtype, "--kv-blocks", kv_blocks, "--grace", 5] + (["--compile"] if compiled else [])
    results: dict = {"model": config, "dtype": dtype,
                     "server": {"device": device.type, "max_batch": max_batch, "kv_blocks": kv_blocks,
                                "block_tokens": BLOCK, "compiled_decode": compiled, "threads": 1 if quick else None},
                     "requests": {"per_level": dict(zip(map(str, levels), counts)), "prompt_tokens": list(prompts),
                                  "output_tokens": output_tokens, "streamed": True, "ignore_eos": True,
                                  "temperature": "0" if args.greedy else "half 0, half 0.8"},
                     "levels": {}}
    work = Path(tempfile.mkdtemp(prefix="groundup-gpu-serve-"))
    log_path = work / "server.log"
    proc = None
    try:
        t = time.perf_counter()
        model = serve_load.build_model(work, config, texts=3 if quick else 30)
        results["build_model_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        with open(log_path, "w") as log:
            proc, url = serve_load.start_server(model, 1 if quick else None, max_batch, device.type, extra,
                                                stderr=log, stdout=log, wait=60 if quick else 300)
        results["server_start_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()  # warm-up: every batch size up to the largest level, then one alone
        warm = level_requests(levels[-1], 0, config["vocab_size"], prompts, min(16, output_tokens), args.greedy)
        asyncio.run(serve_load.run_load(url, warm, levels[-1]))
        asyncio.run(serve_load.run_load(url, warm[:1], 1))
        results["warmup_s"] = round(time.perf_counter() - t, 1)
        for concurrency, n in zip(levels, counts):
            reqs = level_requests(n, concurrency, config["vocab_size"], prompts, output_tokens, args.greedy)
            results["levels"][str(concurrency)] = measure(url, reqs, concurrency)
    except Exception as e:  # noqa: BLE001 - any failure is a note in the result
        notes.append(f"failed: {type(e).__name__}: {e}")
        if log_tail(log_path):
            notes.append(f"server log: {log_tail(log_path)}")
    finally:
        if proc is not None:
            serve_load.stop_server(proc, 10)
        shutil.rmtree(work, ignore_errors=True)  # the full model's checkpoint is half a gigabyte

    measured = results["levels"]
    low, high = measured.get(str(levels[0])), measured.get(str(levels[-1]))
    ratio = round(high["tokens_per_s"] / low["tokens_per_s"], 2) if low and high and low["tokens_per_s"] else None
    results[f"speedup_c{levels[-1]}_vs_c1"] = ratio
    bad = sum(r["errors"] + r["incomplete"] for r in measured.values()) if len(measured) == len(levels) else None
    results["errors"] = sum(r["errors"] for r in measured.values())
    results["incomplete"] = sum(r["incomplete"] for r in measured.values())
    goals = [goal("server tokens/s at concurrency 64 vs 1", 10, ratio),
             goal("errors + incomplete responses at every level", 0, bad, higher_is_better=False)]
    write_result(args.out, "serve", device, quick, began, results, goals, notes)
    return 0 if len(measured) == len(levels) else 1


if __name__ == "__main__":
    sys.exit(main())
