"""Held-out chat arithmetic and bits per byte of one model: the numbers the SFT and alignment results quote.

    .venv/bin/python benchmarks/chat_math.py MODEL --data OUT/chat/chat-math.heldout.jsonl [--n 200]
                                             [--native] [--bpb OUT/tokens] [--threads 1]
                                             [--best-of 8 --reward rm:RM_RUN]

MODEL: a model, run or adapter directory. Greedy replies (48 new tokens) to the first --n held-out
conversations: exact match strict (the `Answer: N` line) and lenient (the last number), the share of
replies that end their turn; --native asks the same questions in the pretraining format
(`Question: ...\\nSolution:`), the fair measure of a base model; --bpb adds the validation bits per
byte per domain of token shards; --best-of N --reward R samples N replies per question (T 1.0) and
reports the exact match of R's top pick (a reward model: `rm:RUN`), against a random pick, a majority
vote of the N answers and pass@N. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter

import torch

from groundup.data.readers import ReadStats
from groundup.eval.perplexity import evaluate
from groundup.loading import load_for_inference
from groundup.posttrain.chat_eval import chat_metrics, native_math_metrics
from groundup.posttrain.records import iter_examples


@torch.no_grad()
def best_of_metrics(model, tok, data: str, count: int, n: int, reward: str, max_new_tokens: int, seed: int = 7) -> dict:
    from groundup.infer import Generator
    from groundup.rewards.functions import extract_answer, load_rewards, score
    from groundup.posttrain.rollout import read_prompts, sample_scored

    unmarked, marked, _ = read_prompts([data], tok, model.cfg.max_seq_len - max_new_tokens)
    prompts = (unmarked + marked)[:count]
    outs, right, _ = sample_scored(Generator(model, tok), prompts, load_rewards(["exact_match"]), n,
                                   max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    judge, rng = load_rewards([reward]), random.Random(seed)
    picked = voted = randomly = solved = 0.0
    for j, p in enumerate(prompts):
        texts, ok = [o.text for o in outs[j * n : (j + 1) * n]], right[j * n : (j + 1) * n]
        scores = [score(judge, p.text, t, p.fields, p.messages)[0] for t in texts]
        picked += ok[max(range(n), key=lambda i: (scores[i], -i))]
        answers = Counter(a for a in (extract_answer(t, True) for t in texts) if a is not None)
        voted += bool(answers) and answers.most_common(1)[0][0] == str(p.fields.get("answer")).replace(",", "")
        randomly += ok[rng.randrange(n)]
        solved += max(ok) > 0
    q = max(1, len(prompts))
    return {"n": n, "reward": reward, "questions": len(prompts), "best_of_n": picked / q, "random_pick": randomly / q,
            "majority_vote": voted / q, "pass_at_n": solved / q}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--data", required=True, help="held-out chat-math JSONL (data sample --chat writes it)")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--native", action="store_true")
    p.add_argument("--bpb", default="", help="token shards for bits per byte (validation split)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--best-of", type=int, default=0, metavar="N", help="also: N samples a question, --reward's top pick")
    p.add_argument("--reward", default="", help="with --best-of: rm:RUN (a reward model), a shipped reward or module:function")
    a = p.parse_args()
    if a.best_of and not a.reward:
        p.error("--best-of needs --reward")
    torch.set_num_threads(a.threads)
    model, tok = load_for_inference(a.model, merge=True)
    examples = list(iter_examples([a.data], ReadStats(), []))[: a.n]
    started = time.perf_counter()
    out = {"model": a.model, "chat": chat_metrics(model, tok, examples, a.max_new_tokens)}
    if a.native:
        out["native"] = native_math_metrics(model, tok, examples, a.max_new_tokens)
    if a.best_of:
        out["best_of"] = best_of_metrics(model, tok, a.data, a.n, a.best_of, a.reward, a.max_new_tokens)
    if a.bpb:
        found = evaluate(model, a.bpb, split="val", tokenizer=tok)
        out["bpb"] = {d: round(v["bpb"], 4) for d, v in found["domains"].items()}
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
