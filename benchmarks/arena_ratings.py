"""Arena ratings on a simulated log: how close to the true ratings, how often the intervals cover them, and the time.

    .venv/bin/python benchmarks/arena_ratings.py [--models 8] [--battles 5000] [--bootstrap 200] [--seeds 3]

Battles are drawn from Bradley-Terry ratings spread evenly over 400 points (mean 1000), with 15% ties
(expected score = the BT probability, so the MLE targets the true ratings). Per seed: the largest error of
the MLE rating, the share of models whose 95% bootstrap interval holds the true rating, whether the order is
right, and the seconds for the fit and for the bootstrap. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from groundup.arena.ratings import RatingConfig, bootstrap_ratings, bt_ratings, encode


def simulate(true: dict[str, float], n: int, seed: int, tie: float = 0.15) -> list[dict]:
    rng = np.random.default_rng(seed)
    names = list(true)
    rows = []
    for _ in range(n):
        i, j = rng.choice(len(names), 2, replace=False)
        a, b = names[i], names[j]
        p = 1 / (1 + 10 ** ((true[b] - true[a]) / 400))
        if rng.random() < tie:
            winner = "tie"
        else:
            winner = "model_a" if rng.random() < (p - tie / 2) / (1 - tie) else "model_b"
        rows.append({"model_a": a, "model_b": b, "winner": winner})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=8)
    ap.add_argument("--battles", type=int, default=5000)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    ratings = np.linspace(1200, 800, args.models)
    true = {f"m{i:02d}": float(r) for i, r in enumerate(ratings)}
    runs = []
    for seed in range(args.seeds):
        rows = simulate(true, args.battles, seed)
        table = encode(rows)
        cfg = RatingConfig(bootstrap=args.bootstrap, seed=seed)
        t0 = time.perf_counter()
        fit = bt_ratings(table, cfg)
        t1 = time.perf_counter()
        boot = bootstrap_ratings(table, cfg)
        t2 = time.perf_counter()
        lower, upper = np.percentile(boot, 2.5, axis=0), np.percentile(boot, 97.5, axis=0)
        truth = np.array([true[m] for m in table.models])
        runs.append({"seed": seed, "max_abs_error": round(float(np.abs(fit - truth).max()), 2),
                     "coverage": round(float(np.mean((lower <= truth) & (truth <= upper))), 3),
                     "order_right": bool(np.all(np.argsort(-fit) == np.argsort(-truth))),
                     "fit_s": round(t1 - t0, 4), "bootstrap_s": round(t2 - t1, 2)})
    print(json.dumps({"models": args.models, "battles": args.battles, "bootstrap": args.bootstrap, "runs": runs},
                     indent=1))


if __name__ == "__main__":
    main()
