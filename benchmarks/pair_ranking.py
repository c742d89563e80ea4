"""How often a model ranks the chosen reply of a preference pair above the rejected one.

    .venv/bin/python benchmarks/pair_ranking.py MODEL --pairs PAIRS.jsonl [--threads 1]

MODEL: a language model (SFT, DPO, ... run or model directory), ranked by its log-likelihood of each
completion (the sum over its tokens, and the mean per token), or a reward model (`groundup rm`),
ranked by its score. The pairs are read exactly as `groundup dpo`/`rm` read them (TRL's format). A
language model's own likelihood is the baseline a reward model trained on the same pairs should beat;
DPO's implicit reward adds the reference's. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from groundup.loading import load_for_inference
from groundup.posttrain.pairs import read_pairs
from groundup.posttrain.preference import make_batch, sequence_logps
from groundup.posttrain.reward_model import pair_rewards


@torch.no_grad()
def rank_pairs(model, tok, pairs: list, batch_size: int = 32) -> dict:
    pad = tok.pad_id if tok.pad_id is not None else tok.eot_id
    for i, x in enumerate(pairs):
        x.index = i
    is_rm = model.value_head is not None
    right_sum = right_mean = 0
    for i in range(0, len(pairs), batch_size):
        part = pairs[i : i + batch_size]
        if is_rm:
            chosen, rejected = pair_rewards(model, make_batch(part, "rm", pad, pairs), "cpu")
            right_sum += int((chosen > rejected).sum())
            continue
        b = make_batch(part, "dpo", pad, pairs)
        lp = sequence_logps(model, b.inputs, b.targets, "cpu").float()
        chosen, rejected = lp[: len(part)], lp[len(part):]
        right_sum += int((chosen > rejected).sum())
        right_mean += int((chosen / b.extra[:, 0] > rejected / b.extra[:, 1]).sum())
    n = max(1, len(pairs))
    if is_rm:
        return {"kind": "reward model", "pairs": len(pairs), "accuracy": right_sum / n}
    return {"kind": "log-likelihood", "pairs": len(pairs), "accuracy_sum": right_sum / n, "accuracy_per_token": right_mean / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--pairs", required=True, nargs="+", help="JSONL/Parquet preference pairs (prompt, chosen, rejected)")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load_for_inference(a.model, merge=True)
    pairs, report = read_pairs(a.pairs, tok, model.cfg.max_seq_len + 1)
    started = time.perf_counter()
    out = {"model": a.model, **rank_pairs(model, tok, pairs), "skipped": len(report.skipped)}
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
