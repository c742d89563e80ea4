"""Training data from a model's own samples, scored by verifiable rewards: preference pairs for DPO
(`groundup data pairs`) and the kept completions of rejection sampling (`groundup rft`).

    pairs = make_pairs(gen, prompts, rewards, k=8)       # chosen: the best-scored sample, rejected: the worst
    kept = best_completions(gen, prompts, rewards, k=8, threshold=None)   # the best (or all >= threshold)

A prompt whose samples all score the same gives no pair (nothing to prefer); ties for best or worst
are broken by sample order, so the output is deterministic for a seed.
"""

from __future__ import annotations

import json
from pathlib import Path

from groundup.io import atomic_open
from groundup.posttrain.rollout import Prompt, sample_scored


def make_pairs(gen, prompts: list[Prompt], rewards, k: int, errors: list[str] | None = None, **sampling) -> list[dict]:
    """TRL-format pairs (chosen scores higher than rejected) from k samples per prompt."""
    outs, totals, _ = sample_scored(gen, prompts, rewards, k, errors, **sampling)
    pairs = []
    for j, p in enumerate(prompts):
        scores = totals[j * k : (j + 1) * k]
        best = max(range(k), key=lambda i: (scores[i], -i))
        worst = min(range(k), key=lambda i: (scores[i], i))
        if scores[best] == scores[worst] or outs[j * k + best].text == outs[j * k + worst].text:
            continue
        chosen, rejected = outs[j * k + best].text, outs[j * k + worst].text
        record = {k2: v for k2, v in p.fields.items() if k2 != "split"}
        if p.messages is not None:
            pairs.append({"prompt": p.messages, "chosen": [{"role": "assistant", "content": chosen}],
                          "rejected": [{"role": "assistant", "content": rejected}], "chosen_score": scores[best],
                          "rejected_score": scores[worst], **record})
        else:
            pairs.append({"prompt": p.text, "chosen": chosen, "rejected": rejected, "chosen_score": scores[best],
                          "rejected_score": scores[worst], **record})
    return pairs


def best_completions(gen, prompts: list[Prompt], rewards, k: int, threshold: float | None = None,
                     errors: list[str] | None = None, **sampling) -> tuple[list[dict], dict]:
    """Chat records of the kept samples (the best per prompt, or every one at or above `threshold`)
    and statistics (mean reward of all samples, kept count)."""
    outs, totals, _ = sample_scored(gen, prompts, rewards, k, errors, **sampling)
    kept = []
    for j, p in enumerate(prompts):
        scores = totals[j * k : (j + 1) * k]
        if threshold is None:
            chosen = [max(range(k), key=lambda i: (scores[i], -i))]
        else:
            chosen = [i for i in range(k) if scores[i] >= threshold]
        for i in chosen:
            messages = list(p.messages or [{"role": "user", "content": p.text}])
            kept.append({"messages": messages + [{"role": "assistant", "content": outs[j * k + i].text}],
                         "reward": scores[i]})
    stats = {"samples": len(outs), "mean_reward": sum(totals) / max(1, len(totals)), "kept": len(kept)}
    return kept, stats


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    with atomic_open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return Path(path)
