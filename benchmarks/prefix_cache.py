"""Prefix caching: time to first token for requests that share a long prefix, with the engine's cache and without.

    .venv/bin/python benchmarks/prefix_cache.py [--prefix 1000] [--requests 10] [--threads 1]

The model is decode.py's shape (vocab 8192, d_model 384, 6 layers, context 1024), randomly initialised.
Every request is the same `--prefix`-token prefix (a system prompt, few-shot examples) and its own
8-token question, sent one after the other; time to first token is measured from submission to the
first generated token (the prefill and the first sample). Each side runs on its own engine core; the
first request of the cached side fills the cache, so both sides report the median over the later
requests. The greedy outputs of both sides are compared. Prints one JSON object.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from infer_helpers import small_tokenizer  # noqa: E402  (a 512-token BPE trained in a second)

from groundup.infer.core import EngineCore, Request  # noqa: E402
from groundup.infer.sampling import SamplingConfig  # noqa: E402
from groundup.model import ModelConfig, Transformer  # noqa: E402

CONFIG = dict(vocab_size=8192, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2, d_ff=1024, max_seq_len=1024,
              tie_embeddings=False, init_std=0.05)


def serve_one(core: EngineCore, prompt: list[int], new_tokens: int) -> tuple[float, list[int]]:
    """(seconds to the first token, the greedy tokens) of one request alone on the core."""
    request = Request(prompt, SamplingConfig(max_new_tokens=new_tokens, temperature=0), stop_ids=frozenset())
    start = time.perf_counter()
    core.add(request)
    tokens, first = [], None
    while core.has_work():
        for e in core.step():
            if e.token is not None:
                first = first or time.perf_counter() - start
                tokens.append(e.token)
    return first, tokens


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prefix", type=int, default=1000)
    p.add_argument("--requests", type=int, default=10)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**CONFIG)).eval()
    tok = small_tokenizer()
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(1, 512, (args.prefix,), generator=g).tolist()
    prompts = [prefix + torch.randint(1, 512, (8,), generator=g).tolist() for _ in range(args.requests)]
    sides = {"cached": EngineCore(model, tok, max_batch=1), "uncached": EngineCore(model, tok, max_batch=1,
                                                                                   prefix_caching=False)}
    serve_one(sides["uncached"], prompts[0][:64], 2)  # warm up the kernels on both
    serve_one(sides["cached"], [7] * 64, 2)
    ttft = {name: [] for name in sides}
    outputs = {name: [] for name in sides}
    for prompt in prompts:  # alternate, so both sides see the same machine
        for name, core in sides.items():
            seconds, tokens = serve_one(core, prompt, args.new_tokens)
            ttft[name].append(seconds)
            outputs[name].append(tokens)
    cached, uncached = (statistics.median(ttft[k][1:]) for k in ("cached", "uncached"))
    pool = sides["cached"].pool
    print(json.dumps({
        "prefix_tokens": args.prefix, "requests": args.requests, "threads": args.threads,
        "ttft_ms": {"cached": round(cached * 1000, 1), "uncached": round(uncached * 1000, 1),
                    "first_request_cached_side": round(ttft["cached"][0] * 1000, 1)},
        "speedup": round(uncached / cached, 2),
        "outputs_identical": outputs["cached"] == outputs["uncached"],
        "prefix_cache_hits": pool.hits, "prefix_cache_queries": pool.queries,
        "torch": torch.__version__, "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
    }, indent=2))


if __name__ == "__main__":
    main()
