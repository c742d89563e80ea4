"""Preference pairs from a model's own samples ranked by an AI judge against a constitution (`data pairs --judge`).

    records, counts, errors = judged_pairs(gen, prompts, source, constitution, RankingConfig(), k=8, seed=0)

Each prompt's k samples are drawn exactly as the reward-ranked path draws them (rollout.sample_scored, the
same seeds), then judged/ranking.py scores them: listwise, one strict ranking; pairwise, wins minus losses
over both orders of every pair. Chosen is the best-scored distinct sample, rejected the worst (with
`per_prompt` > 1, the i-th best against the i-th worst while the chosen scores higher: sampled_data's
`ranked_pairs`), written in TRL's prompt/chosen/rejected format with each side's rank among the distinct
samples (1 = best; equal scores share a rank). A prompt whose samples the judge could not rank (malformed
verdicts after every retry, a failed request) gives no pair and is an error line "prompt: why"; a prompt
whose samples all tie, or are one text, gives no pair either (nothing to prefer). Judging a chunk's
prompts is one `rank_candidates` call seeded with the chunk's seed, so a chunked, resumed job judges as an
uninterrupted one with the same chunk size.
"""

from __future__ import annotations

from groundup.data.annotate import shown_url
from groundup.data.input_tasks import input_fingerprint
from groundup.judge.ranking import RankingConfig, rank_candidates
from groundup.judge.sources import ChatSource, is_endpoint
from groundup.layout import resolve_model_dir
from groundup.posttrain.rollout import Prompt, sample_scored
from groundup.posttrain.sampled_data import ranked_pairs

JUDGE_COUNTS = ("requests", "malformed", "failed", "unjudged", "comparisons", "inconsistent")


def judge_identity(spec: str):
    """What a resumed job compares to know it has the same judge: an endpoint's URL (no credentials) and
    model name, or a checkpoint's fingerprint (path, files, bytes, modification time)."""
    if is_endpoint(spec):
        url, _, model = spec.partition("#")
        return shown_url(url) + (f"#{model}" if model else "")
    return input_fingerprint([resolve_model_dir(spec, note=lambda _: None)])[0]


def _ranks(scores: list[float]) -> list[int]:
    """Competition ranks of the scores: 1 + how many distinct values are higher."""
    values = sorted(set(scores), reverse=True)
    return [1 + values.index(s) for s in scores]


def judged_pairs(gen, prompts: list[Prompt], source: ChatSource, constitution: str, cfg: RankingConfig, k: int,
                 per_prompt: int = 1, seed: int = 0, batch_rows: int = 32,
                 **sampling) -> tuple[list[dict], dict, list[str]]:
    """(pairs, counts, errors): see the module docstring. counts: pairs, paired (prompts with a pair),
    judged (prompts ranked), samples, and the judge's own as judge_<name> (ranking.Rankings.counts)."""
    scored = sample_scored(gen, prompts, [], k, batch_rows=batch_rows, seed=seed, **sampling)
    texts = [[o.text for o in scored.outs[j * k : (j + 1) * k]] for j in range(len(prompts))]
    items = [(p.messages or [{"role": "user", "content": p.text}], t) for p, t in zip(prompts, texts)]
    ranked = rank_candidates(source, items, constitution, cfg, seed)
    pairs, paired = [], 0
    for p, cands, scores in zip(prompts, texts, ranked.scores):
        if scores is None:
            continue
        chosen_rejected = ranked_pairs(cands, scores, per_prompt)
        paired += bool(chosen_rejected)
        first = list(dict.fromkeys(cands))
        rank = dict(zip(first, _ranks([scores[cands.index(t)] for t in first])))
        record = {key: v for key, v in p.fields.items() if key != "split"}
        chat = p.messages is not None  # a chat prompt's replies are assistant messages, a text's plain text
        reply = (lambda t: [{"role": "assistant", "content": t}]) if chat else (lambda t: t)
        for best, worst in chosen_rejected:
            pairs.append({"prompt": p.messages if chat else p.text, "chosen": reply(cands[best]),
                          "rejected": reply(cands[worst]), "chosen_rank": rank[cands[best]],
                          "rejected_rank": rank[cands[worst]], **record})
    counts = {"pairs": len(pairs), "paired": paired, "judged": len(prompts) - ranked.counts["unjudged"],
              "samples": len(scored.outs), **{f"judge_{key}": ranked.counts[key] for key in JUDGE_COUNTS}}
    return pairs, counts, ranked.errors


def judge_summary(counts: dict, prompts: int) -> str:
    """The run's last line after the pairs count: how the judge fared."""
    judged, paired = counts.get("judged", 0), counts.get("paired", 0)
    parts = [f"{judged - paired:,} had samples the judge found alike",
             f"{counts.get('judge_unjudged', 0):,} not judged",
             f"{counts.get('judge_requests', 0):,} judge requests",
             f"{counts.get('judge_malformed', 0):,} malformed verdicts",
             f"{counts.get('judge_failed', 0):,} failed requests"]
    if counts.get("judge_comparisons"):
        parts.append(f"{counts['judge_inconsistent']:,} of {counts['judge_comparisons']:,} pairs judged "
                     "inconsistently across the swap")
    return f"{counts.get('pairs', 0):,} pairs from {prompts:,} prompts (" + "; ".join(parts) + ")"

