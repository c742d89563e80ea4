"""Training data from a model's own samples, scored by verifiable rewards: preference pairs for DPO
(`groundup data pairs`) and the kept completions of rejection sampling (`groundup rft`).

    pairs, paired = make_pairs(gen, prompts, rewards, k=8)   # chosen: the best-scored sample, rejected: the worst
    pairs, paired = make_pairs(gen, prompts, rewards, k=8, per_prompt=4)   # and the 2nd best against the 2nd worst...
    kept = best_completions(gen, prompts, rewards, k=8, threshold=None)   # the best (or all >= threshold)

A prompt whose samples all score the same gives no pair (nothing to prefer); ties for best or worst
are broken by sample order, so the output is deterministic for a seed. With `per_prompt` > 1 the
distinct samples pair up from both ends of the ranking (no text is used twice), so one prompt with
three right and five wrong samples gives three pairs rather than one.
"""

from __future__ import annotations

from groundup.posttrain.rollout import Prompt, sample_scored


def ranked_pairs(texts: list[str], scores: list[float], per_prompt: int = 1) -> list[tuple[int, int]]:
    """(chosen, rejected) sample indices: the i-th best distinct text against the i-th worst, for i up to
    `per_prompt`, while the chosen scores strictly higher; ties go to the earlier sample."""
    first: dict[str, int] = {}
    for i, t in enumerate(texts):
        first.setdefault(t, i)
    distinct = list(first.values())
    best = sorted(distinct, key=lambda i: (-scores[i], i))
    worst = sorted(distinct, key=lambda i: (scores[i], i))
    out: list[tuple[int, int]] = []
    for c, r in zip(best[:per_prompt], worst[:per_prompt]):
        if scores[c] <= scores[r]:
            break
        out.append((c, r))
    return out


def make_pairs(gen, prompts: list[Prompt], rewards, k: int, errors: list[str] | None = None, per_prompt: int = 1,
               **sampling) -> tuple[list[dict], int]:
    """(TRL-format pairs (chosen scores higher than rejected) from k samples per prompt, the number of
    prompts that gave at least one)."""
    outs, totals, _ = sample_scored(gen, prompts, rewards, k, errors, **sampling)
    pairs, paired = [], 0
    for j, p in enumerate(prompts):
        texts, scores = [o.text for o in outs[j * k : (j + 1) * k]], totals[j * k : (j + 1) * k]
        record = {k2: v for k2, v in p.fields.items() if k2 != "split"}
        ranked = ranked_pairs(texts, scores, per_prompt)
        paired += bool(ranked)
        chat = p.messages is not None  # a chat prompt's replies are assistant messages, a text's plain text
        reply = (lambda t: [{"role": "assistant", "content": t}]) if chat else (lambda t: t)
        for best, worst in ranked:
            pairs.append({"prompt": p.messages if chat else p.text, "chosen": reply(texts[best]),
                          "rejected": reply(texts[worst]), "chosen_score": scores[best],
                          "rejected_score": scores[worst], **record})
    return pairs, paired


def best_completions(gen, prompts: list[Prompt], rewards, k: int, threshold: float | None = None,
                     errors: list[str] | None = None, **sampling) -> tuple[list[dict], dict]:
    """Chat records of the kept samples (the best per prompt, or every one at or above `threshold`)
    and statistics (samples drawn, the sum of their rewards, kept count)."""
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
    stats = {"samples": len(outs), "reward_sum": sum(totals), "kept": len(kept)}
    return kept, stats

