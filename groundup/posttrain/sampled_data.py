"""Training data from a model's own samples, scored by verifiable rewards: preference pairs for DPO
(`groundup data pairs`) and the kept completions of rejection sampling (`groundup rft`).

    pairs, counts = make_pairs(gen, prompts, rewards, k=8)   # chosen: the best-scored sample, rejected: the worst
    pairs, counts = make_pairs(gen, prompts, rewards, k=8, per_prompt=4)   # and the 2nd best against the 2nd worst...
    kept, counts = best_completions(gen, prompts, rewards, k=8, threshold=None)   # the best (or all >= threshold)

A sample whose reward failed is neither paired nor kept (its 0 is no judgement of it). Without a
threshold a prompt's best sample is kept only when it beats another or scores above 0.
A prompt whose samples all score the same gives no pair (nothing to prefer); ties for best or worst
are broken by sample order, so the output is deterministic for a seed. With `per_prompt` > 1 the
distinct samples pair up from both ends of the ranking (no text is used twice), so one prompt with
three right and five wrong samples gives three pairs rather than one.
"""

from __future__ import annotations

from groundup.infer.tool_loop import ToolRollout
from groundup.posttrain.rollout import Prompt, sample_scored
from groundup.posttrain.tool_rollout import trajectory_record


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


def _tally_counts(scored) -> dict:
    """What a chunk's samples add to a job's counts (summed over chunks; `nothing_written` reads them)."""
    return {"samples": scored.tally.samples, "failed": sum(scored.failed), "varied": scored.tally.varied,
            "nonzero": sum(t != 0 for t, f in zip(scored.totals, scored.failed) if not f)}


def nothing_written(counts: dict, failure_examples: list[str], otherwise: str) -> str:
    """Why a job's samples gave no record: every reward call failed, every sample scored 0, or `otherwise`."""
    n = counts.get("samples", 0)
    if n and counts.get("failed", 0) >= n:
        example = f"e.g. {failure_examples[0]}" if failure_examples else "see the failures above"
        return f"the rewards failed on every one of the {n:,} samples ({example})"
    if not counts.get("nonzero", 0):
        return f"every one of the {n:,} samples scored 0" + (" or its reward failed" if counts.get("failed") else "")
    return otherwise


def make_pairs(gen, prompts: list[Prompt], rewards, k: int, errors: list[str] | None = None, per_prompt: int = 1,
               health=None, **sampling) -> tuple[list[dict], dict]:
    """(TRL-format pairs (chosen scores higher than rejected) from k samples per prompt, counts: pairs,
    prompts that gave at least one, samples, samples whose reward failed, samples scoring other than 0).
    A sample whose reward failed is in no pair: its 0 is no judgement of it."""
    scored = sample_scored(gen, prompts, rewards, k, errors, health=health, **sampling)
    pairs, paired = [], 0
    for j, p in enumerate(prompts):
        ok = [i for i in range(j * k, (j + 1) * k) if not scored.failed[i]]
        texts, scores = [scored.outs[i].text for i in ok], [scored.totals[i] for i in ok]
        record = {k2: v for k2, v in p.fields.items() if k2 != "split"}
        ranked = ranked_pairs(texts, scores, per_prompt)
        paired += bool(ranked)
        chat = p.messages is not None  # a chat prompt's replies are assistant messages, a text's plain text
        reply = (lambda t: [{"role": "assistant", "content": t}]) if chat else (lambda t: t)
        for best, worst in ranked:
            pairs.append({"prompt": p.messages if chat else p.text, "chosen": reply(texts[best]),
                          "rejected": reply(texts[worst]), "chosen_score": scores[best],
                          "rejected_score": scores[worst], **record})
    return pairs, {"pairs": len(pairs), "paired": paired, **_tally_counts(scored)}


def kept_samples(scores: list[float], failed: list[bool], threshold: float | None) -> list[int]:
    """Which of one prompt's samples are kept: every one scoring at least `threshold`; with none, the
    best, when it beats another sample or scores above 0 (samples all scoring 0 teach nothing). A
    sample whose reward failed is never kept."""
    ok = [i for i in range(len(scores)) if not failed[i]]
    if threshold is not None:
        return [i for i in ok if scores[i] >= threshold]
    if not ok:
        return []
    best = max(ok, key=lambda i: (scores[i], -i))
    return [best] if scores[best] > 0 or any(scores[i] < scores[best] for i in ok) else []


def best_completions(gen, prompts: list[Prompt], rewards, k: int, threshold: float | None = None,
                     errors: list[str] | None = None, health=None, **sampling) -> tuple[list[dict], dict]:
    """Chat records of the kept samples (`kept_samples`) and counts (samples drawn, the sum of their
    rewards, kept, samples whose reward failed, samples scoring other than 0)."""
    scored = sample_scored(gen, prompts, rewards, k, errors, health=health, **sampling)
    kept = []
    for j, p in enumerate(prompts):
        scores = scored.totals[j * k : (j + 1) * k]
        for i in kept_samples(scores, scored.failed[j * k : (j + 1) * k], threshold):
            out = scored.outs[j * k + i]
            if isinstance(out, ToolRollout):  # the whole trajectory: calls, results, answer (and the tools shown)
                kept.append({**trajectory_record(p, out), "reward": scores[i]})
                continue
            messages = list(p.messages or [{"role": "user", "content": p.text}])
            kept.append({"messages": messages + [{"role": "assistant", "content": out.text}], "reward": scores[i]})
    return kept, {"reward_sum": sum(scored.totals), "kept": len(kept), **_tally_counts(scored)}
