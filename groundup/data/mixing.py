"""Domain mixing: reach target shares of output bytes by up- and down-sampling documents.

Given the bytes B_d that survive curation in each domain and target shares p_d, the output size
T is the deduplicated size (or `mixing.total_bytes`), lowered if some domain would need more than
`max_repeats` copies of each of its documents: T = min(T0, min_d max_repeats * B_d / p_d). Each
domain then has a rate r_d = p_d * T / B_d, and each document is written floor(r_d) times plus
once more with probability frac(r_d), decided by a hash of its id and the seed, so the choice
does not depend on shard boundaries or worker count and a rerun makes the same one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import xxhash

from groundup.data.curate_config import MixingConfig


@dataclass
class MixPlan:
    rates: dict[str, float] = field(default_factory=dict)  # domain -> expected copies per document
    target_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def copies(self, doc_id: str, domain: str, seed: int, max_repeats: int) -> int:
        """How many times to write this document (0 drops it)."""
        rate = self.rates.get(domain)
        if rate is None:
            return 1  # no mixing configured
        whole = math.floor(rate)
        u = xxhash.xxh3_64_intdigest(f"{seed}\0{doc_id}".encode("utf-8", errors="surrogatepass")) / 2.0**64
        return min(max_repeats, whole + (1 if u < rate - whole else 0))


def plan_mix(available: dict[str, int], cfg: MixingConfig) -> MixPlan:
    """Rates per domain from the bytes `available` after filtering and deduplication."""
    if not cfg.weights:
        return MixPlan(notes=["no mixing weights configured: every kept document is written once"])
    notes = []
    weights = {d: w for d, w in cfg.weights.items() if w > 0}
    missing = [d for d in weights if available.get(d, 0) == 0]
    for d in missing:
        notes.append(f"domain '{d}' has weight {weights.pop(d)} but no documents survived curation: "
                     "the other weights were renormalised")
    unweighted = [d for d in available if d not in cfg.weights and available[d] > 0]
    if unweighted:
        notes.append(f"domains without a weight are dropped: {', '.join(sorted(unweighted))}")
    if not weights:
        notes.append("no weighted domain has documents: nothing is written")
        return MixPlan(rates={d: 0.0 for d in available}, notes=notes)
    total_weight = sum(weights.values())
    shares = {d: w / total_weight for d, w in weights.items()}
    target = cfg.total_bytes if cfg.total_bytes is not None else sum(available[d] for d in shares)
    cap = min(cfg.max_repeats * available[d] / p for d, p in shares.items())
    if cap < target:
        notes.append(f"output lowered from {target:,} to {int(cap):,} bytes so that no document "
                     f"is repeated more than {cfg.max_repeats} times")
        target = cap
    rates = {d: shares[d] * target / available[d] for d in shares}
    rates.update({d: 0.0 for d in available if d not in shares})
    return MixPlan(rates=rates, target_bytes=int(target), notes=notes)
