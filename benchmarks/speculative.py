"""Speculative decoding: tokens/s with and without it in one run, the acceptance rate, identical outputs.

    .venv/bin/python benchmarks/speculative.py --target OUT/models/base --prompts OUT/raw/python-stdlib.jsonl \\
        [--draft DRAFT_RUN] [--k 2,4] [--new-tokens 64] [--rounds 3]

OUT is a demo run's output (`./scripts/demo.sh`); the prompts are the first tokens of its code domain's
documents (the raw python-stdlib.jsonl the demo samples). A draft model is any groundup model over the
same tokenizer, e.g. a quarter-width two-layer model trained by `groundup train` on the demo's tokens:

    groundup train --config OUT/configs/pretrain.toml --out DRAFT_RUN model.d_model=64 model.n_layers=2 \\
        model.n_heads=2 model.n_kv_heads=1 model.d_ff=192 train.time_limit_s=360

Each round decodes every prompt alone (batch 1, the latency case speculation is for) with plain decoding,
prompt lookup (`ngram`) at each k, and the draft at each k, one after another; greedy (`--temperature 0`,
the default) outputs must equal plain decoding's. Reported per method: tokens/s (median over rounds),
the speed-up (median of the per-round ratios to plain decoding, so load on a shared machine hits both
alike), the acceptance rate (accepted / proposed draft tokens) and tokens per target forward.
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

from groundup.infer import Generator  # noqa: E402
from groundup.infer.speculative import SpeculativeConfig, Speculator  # noqa: E402
from groundup.loading import load_for_inference  # noqa: E402


def code_prompts(path: Path, tok, n: int, length: int) -> list[list[int]]:
    """The first `length` tokens of the first `n` documents that have that many (every 10th record)."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i % 10:
                continue
            ids = tok.encode(json.loads(line)["text"])
            if len(ids) >= length:
                prompts.append(ids[:length])
            if len(prompts) == n:
                break
    return prompts


def decode_all(g: Generator, prompts: list[list[int]], new_tokens: int, temperature: float) -> tuple[list, float]:
    began = time.perf_counter()
    out = [g.generate_ids([p], max_new_tokens=new_tokens, temperature=temperature, stop_ids=(), seed=i)[0]
           for i, p in enumerate(prompts)]
    return out, time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="the target model (a model directory or a training run)")
    p.add_argument("--prompts", type=Path, required=True, help="JSONL with a text field (the demo's code domain)")
    p.add_argument("--draft", default=None, help="a draft model over the same tokenizer (directory or run)")
    p.add_argument("--k", default="2,4", help="comma list of tokens proposed per step")
    p.add_argument("--prompt-count", type=int, default=12)
    p.add_argument("--prompt-tokens", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = load_for_inference(args.target, "cpu", "float32", None)
    draft = load_for_inference(args.draft, "cpu", "float32", None)[0] if args.draft else None
    prompts = code_prompts(args.prompts, tok, args.prompt_count, args.prompt_tokens)
    ks = [int(k) for k in args.k.split(",")]
    methods: dict[str, Speculator | None] = {"plain": None}
    for k in ks:
        methods[f"ngram k={k}"] = Speculator(SpeculativeConfig("ngram", k))
    if draft is not None:
        for k in ks:
            methods[f"draft k={k}"] = Speculator(SpeculativeConfig("draft", k), draft=draft)
    generators = {name: Generator(target, tok, speculator=spec) for name, spec in methods.items()}
    for g in generators.values():  # first calls (allocation, kernels) outside the timing
        decode_all(g, prompts[:1], 4, args.temperature)
    for spec in methods.values():
        if spec is not None:
            spec.proposed = spec.accepted = 0
    steps_before = {name: g.core.steps for name, g in generators.items()}
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    outputs: dict[str, list] = {}
    for r in range(args.rounds):
        for name, g in generators.items():
            outputs[name], s = decode_all(g, prompts, args.new_tokens, args.temperature)
            seconds[name].append(s)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in seconds.items()),
              file=sys.stderr, flush=True)
    tokens = sum(len(o) for o in outputs["plain"])
    report = {"machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                          "torch": torch.__version__},
              "target": {"path": args.target, "params": sum(p.numel() for p in target.parameters())},
              "draft": {"path": args.draft, "params": sum(p.numel() for p in draft.parameters())} if draft else None,
              "prompts": len(prompts), "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "temperature": args.temperature, "rounds": args.rounds, "methods": {}}
    for name, spec in methods.items():
        row = {"tokens_per_s": round(tokens / statistics.median(seconds[name]), 1),
               "speedup": round(statistics.median(b / s for b, s in zip(seconds["plain"], seconds[name])), 3)}
        # Target forwards after each prompt's prefill (which gives its first token): plain decoding's
        # new_tokens - 1 per prompt, fewer when speculation keeps drafts.
        forwards = generators[name].core.steps - steps_before[name]
        row["tokens_per_target_step"] = round(args.rounds * (tokens - len(prompts)) / forwards, 2)
        if spec is not None:
            row |= {"acceptance_rate": round(spec.acceptance_rate, 3), "proposed": spec.proposed,
                    "accepted": spec.accepted}
            if args.temperature == 0:
                row["outputs_identical"] = outputs[name] == outputs["plain"]
        report["methods"][name] = row
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
