"""Rate a battle log and write what `groundup arena` leaves in its folder.

    results = rate_log([Path("battles.jsonl")], Path("arena"), RatingConfig(), baseline="gpt-4")

    DIR/ratings.json    per model: rating, lower, upper, median, rank, rank_range, battles, wins, ties, losses,
                        online_elo; the config; rows read and skipped (reasons, first file:line); the
                        judge's agreement with itself across the swap; AlpacaEval 2 win rates against --baseline
    DIR/report.md       the ratings table with intervals, the win-rate matrix, battles per pair, the judge's
                        agreement across the swap, the length-controlled win rates, and the plots below
    DIR/ratings.png     ratings with their 95% bootstrap intervals
    DIR/win_rate.png    the win-rate matrix as a heat map

Each file is written under a temporary name and renamed, so a crash never leaves one half-written.
Numbers that do not exist (a win rate of a pair that never met) are null in the JSON and "-" in the report.
"""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from groundup.arena.battle_log import one_per_battle, read_battles
from groundup.arena.ratings import ModelRating, RatingConfig, rank_ranges, rate
from groundup.arena.style import STYLE_FEATURES, style_ratings
from groundup.arena.winrate import length_controlled_all, pair_counts, swap_agreement, win_fraction
from groundup.config import fail
from groundup.io import atomic_open, atomic_write_json, atomic_write_text

RATINGS_FILE, REPORT_FILE = "ratings.json", "report.md"
RATINGS_PLOT, WIN_RATE_PLOT = "ratings.png", "win_rate.png"
FORMAT = "groundup-arena-ratings-1"


def _clean(value):
    """JSON without NaN: a number that does not exist is null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        return _clean(value.item())
    return value


def rate_log(paths: Sequence[Path], out: Path, cfg: RatingConfig, baseline: str | None = None,
             each_order: bool = False, progress: bool = True) -> dict:
    """Read the battle log(s), rate them and write DIR/ratings.json, report.md and the plots; returns what
    ratings.json holds. `each_order`: rate both judged orders of a battle as two battles (default: one)."""
    cfg.validate()
    log = read_battles(paths)
    battles = log.rows if each_order else one_per_battle(log.rows)
    seen = {r["model_a"] for r in battles} | {r["model_b"] for r in battles}
    if baseline is not None and baseline not in seen:
        fail("baseline", baseline, f"a model of the log ({', '.join(sorted(seen))})")
    if cfg.anchor and cfg.anchor not in seen:
        fail("anchor", cfg.anchor, f"a model of the log ({', '.join(sorted(seen))}), or '' for no anchor")
    with tqdm(total=cfg.bootstrap, desc="bootstrap", unit="round", disable=not progress) as bar:
        ratings = rate(battles, cfg, bar)
    models = [r.model for r in ratings]
    results = {
        "format": FORMAT, "battle_logs": [str(p) for p in paths], "config": dataclasses.asdict(cfg),
        "each_order": each_order, "rows": len(log.rows), "battles": len(battles),
        "rows_skipped": log.skipped_total, "skipped_reasons": log.reasons(), "skipped_examples": log.problems(),
        "models": [dataclasses.asdict(r) for r in ratings],
        "win_fraction": win_fraction(battles, models).tolist(), "pair_battles": pair_counts(battles, models).tolist(),
        "judge_agreement": swap_agreement(log.rows), "baseline": baseline,
        "length_controlled": length_controlled_all(log.rows, baseline, models) if baseline else {},
        "style_control": style_section(battles, models, cfg, progress) if cfg.style_control else None,
    }
    results = _clean(results)
    out = Path(out)
    atomic_write_json(out / RATINGS_FILE, results)
    plots = write_plots(out, ratings, np.array(win_fraction(battles, models)))
    atomic_write_text(out / REPORT_FILE, render(results, plots))
    return results


def style_section(battles: list[dict], models: list[str], cfg: RatingConfig, progress: bool) -> dict:
    """Style-controlled ratings with intervals and rank ranges, and the style coefficients (arena/style.py),
    over the battles that hold both answers (the others are counted)."""
    usable = [r for r in battles if isinstance(r.get("answer_a"), str) and isinstance(r.get("answer_b"), str)]
    out = {"battles": len(usable), "left_out": len(battles) - len(usable), "features": list(STYLE_FEATURES)}
    if not usable:
        return {**out, "models": [], "coefficients": {}}
    with tqdm(total=cfg.bootstrap, desc="style bootstrap", unit="round", disable=not progress) as bar:
        fit = style_ratings(usable, models, cfg, bar)
    rating, boot = fit["rating"], fit["bootstrap"]
    if cfg.bootstrap:
        lower, upper = np.nanpercentile(boot, 2.5, axis=0), np.nanpercentile(boot, 97.5, axis=0)
        coef_lo, coef_hi = (np.percentile(fit["bootstrap_coef"], q, axis=0) for q in (2.5, 97.5))
    else:
        lower, upper, coef_lo, coef_hi = rating, rating, fit["coef"], fit["coef"]
    ranks = rank_ranges(lower, upper)
    rows = [{"model": m, "rating": rating[i], "lower": lower[i], "upper": upper[i], "rank": ranks[i][0],
             "rank_range": ranks[i]} for i, m in enumerate(models)]
    coefficients = {f: {"coef": fit["coef"][j], "lower": coef_lo[j], "upper": coef_hi[j]}
                    for j, f in enumerate(STYLE_FEATURES)}
    return {**out, "models": sorted(rows, key=lambda r: -r["rating"] if math.isfinite(r["rating"]) else math.inf),
            "coefficients": coefficients}


def _num(value, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _matrix(models: list[str], values: list[list], fmt: str) -> list[str]:
    lines = ["| | " + " | ".join(models) + " |", "| --- |" + " --- |" * len(models)]
    for m, row in zip(models, values):
        lines.append(f"| **{m}** | " + " | ".join("" if a == m else _num(v, fmt) for a, v in zip(models, row)) + " |")
    return lines


def render(results: dict, plots: list[str]) -> str:
    """report.md from what ratings.json holds."""
    cfg, models = results["config"], [r["model"] for r in results["models"]]
    anchor = f"; {cfg['anchor']} held at {cfg['anchor_rating']:g}" if cfg["anchor"] else \
        f"; the mean rating is {cfg['initial']:g}"
    lines = ["# Arena ratings", "",
             f"{results['battles']:,} battles from {results['rows']:,} rows of "
             f"{', '.join(results['battle_logs'])} ({results['rows_skipped']:,} rows skipped). "
             f"Bradley-Terry by maximum likelihood as FastChat's compute_mle_elo (scale {cfg['scale']:g}, base "
             f"{cfg['base']:g}{anchor}), 95% intervals from {cfg['bootstrap']:,} bootstrap rounds "
             f"(seed {cfg['seed']}).",
             ""]
    if results["skipped_examples"]:
        lines += ["Skipped rows (first): " + "; ".join(f"`{e}`" for e in results["skipped_examples"][:5]), ""]
    lines += ["## Ratings", "",
              "| rank | rank range | model | rating | 95% interval | median | online Elo | battles | W / T / L |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["models"]:
        lo, hi = r["rank_range"]
        lines.append(f"| {r['rank']} | {lo}-{hi} | {r['model']} | {_num(r['rating'])} | "
                     f"{_num(r['lower'])} to {_num(r['upper'])} | {_num(r['median'])} | {_num(r['online_elo'])} | "
                     f"{r['battles']:,} | {r['wins']} / {r['ties']} / {r['losses']} |")
    lines += ["", "## Win rate", "", "The share of decisive battles the row's model won against the column's "
              "(ties left out, as FastChat's win-fraction matrix).", ""]
    lines += _matrix(models, results["win_fraction"], ".2f")
    lines += ["", "## Battles per pair", ""] + _matrix(models, results["pair_battles"], "d")
    lines += ["", "## Judge agreement across the swap", ""]
    agreement = {j: a for j, a in results["judge_agreement"].items()}
    if agreement:
        lines += ["A battle judged with the answers in both orders: how often the two verdicts name the same "
                  "winner (or both a tie), and how often a decisive verdict picked the answer shown first "
                  "(0.50 = no position bias).", "",
                  "| judge | battles in both orders | agree | agreement | first shown won |",
                  "| --- | --- | --- | --- | --- |"]
        for judge, a in agreement.items():
            lines.append(f"| {judge or '-'} | {a['pairs']:,} | {a['agree']:,} | {_num(a['agreement'], '.2f')} | "
                         f"{_num(a['first_shown_won'], '.2f')} ({a['decisive']:,} decisive) |")
    else:
        lines.append("The log has no `swap` field: no battle was judged in both orders.")
    if results["baseline"]:
        lines += ["", f"## Win rate against {results['baseline']}", "",
                  "AlpacaEval 2's win rate (ties count half) and its length-controlled win rate: a logistic GLM of "
                  "the preference on the tanh-scaled length difference (and the question's difficulty), "
                  "predicted at zero length difference.", "",
                  "| model | win rate | length-controlled | battles | in the GLM | formula |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for model, lc in results["length_controlled"].items():
            lines.append(f"| {model} | {_num(lc['win_rate'])} ± {_num(lc['standard_error'])} | "
                         f"{_num(lc['length_controlled_winrate'])} ± {_num(lc['lc_standard_error'])} | "
                         f"{lc['n_total']:,} | {lc['n_glm']:,} | `{lc['formula']}` |")
    style = results.get("style_control")
    if style:
        lines += ["", "## Style control", "",
                  f"Ratings with answer length (characters) and markdown (headers, list items, bold) as covariates, "
                  f"as FastChat's style control: {style['battles']:,} battles with both answers "
                  f"({style['left_out']:,} without, left out).", "",
                  "| rank | rank range | model | rating | 95% interval |", "| --- | --- | --- | --- | --- |"]
        for r in style["models"]:
            lines.append(f"| {r['rank']} | {r['rank_range'][0]}-{r['rank_range'][1]} | {r['model']} | "
                         f"{_num(r['rating'])} | {_num(r['lower'])} to {_num(r['upper'])} |")
        lines += ["", "| feature | coefficient | 95% interval |", "| --- | --- | --- |"]
        lines += [f"| {f} | {_num(c['coef'], '.3f')} | {_num(c['lower'], '.3f')} to {_num(c['upper'], '.3f')} |"
                  for f, c in style["coefficients"].items()]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def write_plots(out: Path, ratings: list[ModelRating], fraction: np.ndarray) -> list[str]:
    """ratings.png and win_rate.png (matplotlib's file-only Agg backend); returns the names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.model for r in ratings]
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(names) + 2), 4))
    y = np.array([r.rating for r in ratings])
    err = np.array([[max(0.0, r.rating - r.lower) for r in ratings], [max(0.0, r.upper - r.rating) for r in ratings]])
    ax.errorbar(range(len(names)), y, yerr=err, fmt="o", capsize=4)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set(ylabel="rating", title="Bradley-Terry ratings, 95% bootstrap intervals")
    ax.grid(alpha=0.3)
    _save(fig, out / RATINGS_PLOT, plt)
    fig, ax = plt.subplots(figsize=(max(4, 0.7 * len(names) + 2), max(3.5, 0.6 * len(names) + 1.5)))
    ax.imshow(np.ma.masked_invalid(fraction), cmap="RdBu", vmin=0, vmax=1)
    for i in range(len(names)):
        for j in range(len(names)):
            if math.isfinite(fraction[i, j]):
                ax.text(j, i, f"{fraction[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set(xlabel="model B", ylabel="model A", title="Share of decisive battles A won against B")
    _save(fig, out / WIN_RATE_PLOT, plt)
    return [RATINGS_PLOT, WIN_RATE_PLOT]


def _save(fig, path: Path, plt) -> None:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    with atomic_open(path, "wb") as f:
        f.write(buffer.getvalue())
