"""Held-out chat arithmetic and bits per byte of one model: the numbers the SFT and alignment results quote.

    .venv/bin/python benchmarks/chat_math.py MODEL --data OUT/chat/chat-math.heldout.jsonl [--n 200]
                                             [--native] [--bpb OUT/tokens] [--threads 1]

MODEL: a model, run or adapter directory. Greedy replies (48 new tokens) to the first --n held-out
conversations: exact match strict (the `Answer: N` line) and lenient (the last number), the share of
replies that end their turn; --native asks the same questions in the pretraining format
(`Question: ...\\nSolution:`), the fair measure of a base model; --bpb adds the validation bits per
byte per domain of token shards. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from groundup.data.readers import ReadStats
from groundup.eval.perplexity import evaluate
from groundup.infer.loading import load_for_inference
from groundup.posttrain.chat_eval import chat_metrics, native_math_metrics
from groundup.posttrain.records import iter_examples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--data", required=True, help="held-out chat-math JSONL (data sample --chat writes it)")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--native", action="store_true")
    p.add_argument("--bpb", default="", help="token shards for bits per byte (validation split)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=48)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load_for_inference(a.model, merge=True)
    examples = list(iter_examples([a.data], ReadStats(), []))[: a.n]
    started = time.perf_counter()
    out = {"model": a.model, "chat": chat_metrics(model, tok, examples, a.max_new_tokens)}
    if a.native:
        out["native"] = native_math_metrics(model, tok, examples, a.max_new_tokens)
    if a.bpb:
        found = evaluate(model, a.bpb, split="val", tokenizer=tok)
        out["bpb"] = {d: round(v["bpb"], 4) for d, v in found["domains"].items()}
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
