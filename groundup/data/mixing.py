"""Domain mixing: reach target shares of output bytes by up- and down-sampling documents.

Given the bytes B_d that survive curation in each domain and target shares p_d, the output size
T is the deduplicated size (or `mixing.total_bytes`), lowered if some domain would need more than
`max_repeats` copies of each of its documents: T = min(T0, min_d max_repeats * B_d / p_d). Each
domain then has a rate r_d = p_d * T / B_d: every document is written floor(r_d) times, and
documents taken in a seeded random order get one copy more until frac(r_d) * B_d bytes are
covered. Choosing by bytes rather than by coin flips keeps the achieved share within one
document of the target even when a domain has few, large documents; the order depends only on
the seed and the document's position in the input, not on shards or workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from groundup.config import did_you_mean

from groundup.data.curate_config import MixingConfig
from groundup.data.hashing import fmix64


@dataclass
class MixPlan:
    rates: dict[str, float] = field(default_factory=dict)  # domain -> copies per document (expected)
    target_bytes: int = 0
    notes: list[str] = field(default_factory=list)


def plan_mix(available: dict[str, int], cfg: MixingConfig) -> MixPlan:
    """Rates per domain from the bytes `available` after filtering and deduplication."""
    if not cfg.weights:
        return MixPlan(notes=["no mixing weights configured: every kept document is written once"])
    notes = []
    weights = {d: w for d, w in cfg.weights.items() if w > 0}
    missing = [d for d in weights if available.get(d, 0) == 0]
    for d in missing:
        hint = did_you_mean(d, [x for x in available if x not in cfg.weights])  # a typo drops a whole domain
        notes.append(f"domain '{d}' has weight {weights.pop(d)} but no documents survived curation{hint}: "
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


def assign_copies(plan: MixPlan, domains: np.ndarray, sizes: np.ndarray, alive: np.ndarray, seed: int,
                  max_repeats: int) -> np.ndarray:
    """Copies of every document (0 drops it) that realise `plan` over the surviving documents."""
    copies = alive.astype(np.int16)
    if not plan.rates:
        return copies
    with np.errstate(over="ignore"):
        order_key = fmix64(np.arange(len(domains), dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15))
    for domain in np.unique(domains[alive]):
        rate = plan.rates.get(str(domain), 0.0)
        sel = np.flatnonzero(alive & (domains == domain))
        whole = math.floor(rate)
        copies[sel] = whole
        budget = (rate - whole) * sizes[sel].sum()
        if budget > 0:
            order = sel[np.argsort(order_key[sel], kind="stable")]
            covered = np.cumsum(sizes[order])
            n = int(np.searchsorted(covered, budget, side="right"))
            if n < len(order) and covered[n] - budget < budget - (covered[n - 1] if n else 0):
                n += 1  # the document that crosses the budget lands closer to it than stopping short
            copies[order[:n]] += 1
    return np.minimum(copies, max_repeats)
