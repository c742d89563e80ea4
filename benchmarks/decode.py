"""Greedy decoding speed: groundup's engine against transformers `generate` on the same weights.

    .venv/bin/python benchmarks/decode.py [--new-tokens 256] [--repeat 5] [--compile] [--threads 1]

The model is the training benchmark's shape (vocab 8192, d_model 384, 6 layers, 6 heads, 2 KV
heads, FFN 1024, untied), randomly initialised, exported with `groundup export hf` and loaded by
`AutoModelForCausalLM`, so both sides run the same weights. For fp32 and bf16 and batch 1 and 8,
each side greedily decodes --new-tokens tokens after a 32-token prompt (no early stop); runs
alternate between the two sides and the median of --repeat runs is reported, because the machine
is shared. Also: whether the generated tokens are identical (and where rows first differ), and the
time to first token for a 512-token prompt. With --compile, our engine also runs its
torch.compile'd decode step (compilation time reported separately). On a shared 2-core machine,
--threads 1 keeps both sides out of each other's way: with 2 threads every parallel region waits
for a core another process holds. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

CONFIG = dict(vocab_size=8192, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2, d_ff=1024, max_seq_len=1024,
              tie_embeddings=False, init_std=0.05)  # a wider init than 0.02 keeps argmax ties rare


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def hf_greedy(hf, prompts: torch.Tensor, n: int, **options) -> list[list[int]]:
    """transformers' greedy `generate` of n tokens (no early stop); `options` go to `generate` as well
    (e.g. cache_implementation="static")."""
    out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=n, min_new_tokens=0,
                      do_sample=False, eos_token_id=None, pad_token_id=0, **options)
    return out[:, prompts.shape[1]:].tolist()


def cold(g, rows: list[list[int]], n: int) -> list[list[int]]:
    """Our engine on prompts it has not seen: its prefix cache is emptied first (the same prompts run
    repeatedly here; a real workload's would not all be cached; benchmarks/prefix_cache.py measures that)."""
    g.core.clear_prefix_cache()
    return g.generate_ids(rows, max_new_tokens=n, temperature=0, stop_ids=())


def compare(engines: dict, hf, prompts: torch.Tensor, n: int, repeat: int) -> dict:
    """Median seconds per side (runs interleaved), tokens/s, and whether all sides agree."""
    rows = prompts.tolist()
    sides = {name: (lambda g=g: cold(g, rows, n)) for name, g in engines.items()}
    sides["transformers"] = lambda: hf_greedy(hf, prompts, n)
    times, tokens, _ = race(sides, repeat)
    result = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        result[name] = {"tokens_per_s": round(prompts.shape[0] * n / median, 1), "median_s": round(median, 4),
                        "runs_s": [round(t, 4) for t in ts]}
    hf_rate = result["transformers"]["tokens_per_s"]
    for name in engines:
        result[name]["vs_transformers"] = round(result[name]["tokens_per_s"] / hf_rate, 2)
        result[name]["tokens_identical"] = tokens[name] == tokens["transformers"]
        result[name]["first_difference_per_row"] = [first_difference(a, b) for a, b in zip(tokens[name],
                                                                                           tokens["transformers"])]
    return result


def race(sides: dict, repeat: int, clock=timed, warmups: int = 1) -> tuple[dict, dict, dict]:
    """Each side called `warmups` times (warm-up and compiling, outside the timings), then `repeat` rounds
    of every side in turn (interleaved: a shared machine's slow moments hit each side alike). `clock(fn)`
    -> (seconds, fn's output). Returns per side the seconds of each run, the last run's output and the
    seconds of each warm-up call."""
    warm = {name: [clock(fn)[0] for _ in range(warmups)] for name, fn in sides.items()}
    times = {name: [] for name in sides}
    tokens = {}
    for _ in range(repeat):
        for name, fn in sides.items():
            seconds, tokens[name] = clock(fn)
            times[name].append(seconds)
    return times, tokens, warm


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (None: identical). bf16 rounds differently in each
    implementation, so greedy paths may part after a while; fp32 ones must not."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def time_to_first_token(engines: dict, hf, prompt: torch.Tensor, repeat: int) -> dict:
    rows = prompt.tolist()
    sides = {name: (lambda g=g: cold(g, rows, 1)) for name, g in engines.items()}
    sides["transformers"] = lambda: hf_greedy(hf, prompt, 1)
    out = {}
    for name, fn in sides.items():
        fn()
        out[name] = {"ms": round(1000 * statistics.median(timed(fn)[0] for _ in range(repeat)), 1)}
    for name in engines:
        out[name]["vs_transformers"] = round(out["transformers"]["ms"] / out[name]["ms"], 2)
    return out


def save_for_both(model, tok, work: Path) -> Path:
    """The model (as it is: its dtype is the files') with its tokenizer as WORK/model, and exported with
    `groundup export hf` as WORK/hf, which AutoModelForCausalLM loads: both sides then hold the same weights."""
    from groundup.interop import export_hf
    from groundup.model.model_dir import save_model

    save_model(model, work / "model")
    tok.save(work / "model" / "tokenizer")
    export_hf(work / "model", work / "hf")
    return work / "hf"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--bf16-new-tokens", type=int, default=None, help="(default: --new-tokens)")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--compile", action="store_true", help="also time our torch.compile'd decode step")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    from groundup.config import from_dict
    from groundup.corpus import iter_shakespeare
    from groundup.infer import Generator
    from groundup.model import ModelConfig, Transformer
    from groundup.tokenizer import TokenizerConfig, train_tokenizer

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="groundup-decode-"))
    # A tokenizer as large as the model's vocabulary, so both sides choose among the same 8192 ids
    # (the prompts themselves are random ids).
    texts = [w["text"] for w in itertools.islice(iter_shakespeare(), 30)]
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=CONFIG["vocab_size"]), progress=False)
    torch.manual_seed(0)
    model = Transformer(from_dict(ModelConfig, CONFIG)).eval()
    save_for_both(model, tok, work)
    gen = torch.Generator().manual_seed(1)
    report = {"config": CONFIG, "prompt_tokens": args.prompt_tokens, "threads": torch.get_num_threads(),
              "torch": torch.__version__, "transformers": transformers.__version__,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "results": {}}
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        n = args.new_tokens if dtype == torch.float32 else (args.bf16_new_tokens or args.new_tokens)
        ours = model.to(dtype)
        ours.reset_buffers()  # RoPE tables stay float32, as after loading
        engines = {"groundup": Generator(ours, tok)}
        if args.compile:
            compiled = Generator(ours, tok, compile=True)
            compile_s, _ = timed(lambda: compiled.generate_ids([[1] * 8], max_new_tokens=4, temperature=0))
            report.setdefault("compile_s", {})[dtype_name] = round(compile_s, 1)
            engines["groundup_compiled"] = compiled
        hf = transformers.AutoModelForCausalLM.from_pretrained(work / "hf", dtype=dtype).eval()
        for batch in map(int, args.batch_sizes.split(",")):
            prompts = torch.randint(0, CONFIG["vocab_size"], (batch, args.prompt_tokens), generator=gen)
            with torch.inference_mode():
                result = compare(engines, hf, prompts, n, args.repeat)
            report["results"][f"{dtype_name}_batch{batch}"] = {"new_tokens": n, **result}
            print(json.dumps({f"{dtype_name}_batch{batch}": result}), file=sys.stderr, flush=True)
        long_prompt = torch.randint(0, CONFIG["vocab_size"], (1, 512), generator=gen)
        with torch.inference_mode():
            report["results"][f"{dtype_name}_ttft_512"] = time_to_first_token(engines, hf, long_prompt, args.repeat)
    report["load_average_before_after"] = [round(x, 2) for x in (*load_before[:1], os.getloadavg()[0])]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
