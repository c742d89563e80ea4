"""Bradley-Terry ratings from pairwise battles, as FastChat's Chatbot Arena computes them.

    table = encode(battles)                        # rows with model_a, model_b, winner
    fit = rate(table, RatingConfig())              # MLE ratings, bootstrap intervals, rank ranges, online Elo

The promise: `bt_ratings` is FastChat's `compute_mle_elo` (the Arena notebook and lmsys blog of
2023-12-07, also arena-hard-auto's `show_result.py`), so the numbers agree with it to well under 0.1 points:
- every battle counts twice: a win is two wins, a tie (`tie` or `tie (bothbad)`) one win each way;
- for every ordered pair (i, j) of models a row x with x_i = +ln(base), x_j = -ln(base) is fitted twice,
  label 1 weighted by i's wins over j and label 0 weighted by j's wins over i, by scikit-learn's
  LogisticRegression without intercept and without penalty (tol 1e-6);
- rating = scale * coefficient + initial, then shifted so that the anchor model (if any, and present)
  sits at its rating (FastChat anchors mixtral-8x7b-instruct-v0.1 at 1114); without an anchor the mean
  rating is the initial rating, since no gradient step moves the coefficients' sum away from 0.
One difference: FastChat's notebook aligns three pandas pivot tables, so a model that never won as
model_a gets NaN weights and is silently left out of the fit; here every model that battled is fitted.

The intervals are FastChat's `get_bootstrap_result`: resample the battles with replacement (numpy's
RandomState(seed).choice, exactly what `DataFrame.sample(frac=1, replace=True)` draws after
`np.random.seed(seed)`), refit, and take the 2.5/50/97.5 percentiles per model (a model absent from a
resample has no rating in that round). FastChat's rank is 1 + the number of models whose lower bound is
above this model's upper bound; the rank range runs from that rank to the worst rank the intervals allow
(the number of models whose upper bound is not below this model's lower bound). The online Elo is
FastChat's `compute_online_elo` (K = 4), over the battles in time order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np

from groundup.config import fail

WINNERS = ("model_a", "model_b", "tie", "tie (bothbad)")  # FastChat's verdicts; both ties count alike
SCORE = {"model_a": 1.0, "model_b": 0.0, "tie": 0.5, "tie (bothbad)": 0.5}  # model_a's score in a battle


@dataclasses.dataclass
class RatingConfig:
    """How battles become ratings (FastChat's defaults)."""

    scale: float = 400.0  # Elo points per factor `base` in the odds of winning
    base: float = 10.0  # the odds base of the Elo scale
    initial: float = 1000.0  # the mean rating when there is no anchor (FastChat's INIT_RATING)
    anchor: str = ""  # a model held at `anchor_rating` (FastChat: "mixtral-8x7b-instruct-v0.1"); "" = none
    anchor_rating: float = 1114.0  # the anchor model's rating (FastChat's value for mixtral at 1114)
    bootstrap: int = 1000  # bootstrap rounds for the 95% intervals; 0 = no intervals (lower = upper = rating)
    seed: int = 42  # numpy seed of the resampling (FastChat's elo_analysis seeds 42)
    k: float = 4.0  # the online Elo's step size (FastChat's K)
    # also fit ratings with answer length and markdown as covariates (FastChat's style control, arena/style.py;
    # needs answer_a and answer_b); false = off
    style_control: bool = False

    def validate(self) -> None:
        for key in ("scale", "base", "initial", "anchor_rating", "k"):
            value = getattr(self, key)
            if not math.isfinite(value):
                fail(key, value, "a finite number")
        if self.scale <= 0:
            fail("scale", self.scale, "a number > 0")
        if self.base <= 1:
            fail("base", self.base, "a number > 1")
        if self.k < 0:
            fail("k", self.k, "a number >= 0")
        if self.bootstrap < 0:
            fail("bootstrap", self.bootstrap, "an integer >= 0 (0 = no intervals)")


@dataclasses.dataclass
class BattleTable:
    """Battles as arrays: model indices into `models` (sorted, as FastChat's pivot tables order them)."""

    models: list[str]
    a: np.ndarray  # int64 index of model_a per battle
    b: np.ndarray  # int64 index of model_b per battle
    score: np.ndarray  # model_a's score: 1 win, 0.5 tie, 0 loss


def encode(battles: Iterable[dict]) -> BattleTable:
    """Rows with `model_a`, `model_b`, `winner` (checked already: see arena/battle_log.py) as a BattleTable."""
    rows = list(battles)
    models = sorted({r["model_a"] for r in rows} | {r["model_b"] for r in rows})
    index = {m: i for i, m in enumerate(models)}
    a = np.array([index[r["model_a"]] for r in rows], dtype=np.int64)
    b = np.array([index[r["model_b"]] for r in rows], dtype=np.int64)
    score = np.array([SCORE[r["winner"]] for r in rows], dtype=np.float64)
    return BattleTable(models, a, b, score)


def half_wins(table: BattleTable, counts: np.ndarray | None = None) -> np.ndarray:
    """W[i, j]: i's wins over j counted in halves (a win 2, a tie 1), FastChat's `ptbl_win`; `counts` weighs
    each battle (a bootstrap resample's multiplicities)."""
    n = len(table.models)
    w = np.ones(len(table.a)) if counts is None else counts.astype(np.float64)
    out = np.zeros((n, n))
    np.add.at(out, (table.a, table.b), 2.0 * table.score * w)
    np.add.at(out, (table.b, table.a), 2.0 * (1.0 - table.score) * w)
    return out


def bt_coefficients(wins: np.ndarray, base: float = 10.0) -> np.ndarray:
    """The Bradley-Terry coefficients (in units of ln(base)) from half-win counts, by FastChat's logistic
    regression; a model with no battle keeps 0."""
    from sklearn.linear_model import LogisticRegression  # optional dependency: groundup[arena]

    n = wins.shape[0]
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    x = np.zeros((2 * len(pairs), n))
    y = np.tile([1.0, 0.0], len(pairs))
    weight = np.empty(2 * len(pairs))
    for row, (i, j) in enumerate(pairs):
        x[2 * row : 2 * row + 2, i] = math.log(base)
        x[2 * row : 2 * row + 2, j] = -math.log(base)
        weight[2 * row], weight[2 * row + 1] = wins[i, j], wins[j, i]
    if not weight.any():
        return np.zeros(n)
    # C=inf is scikit-learn >= 1.8's spelling of FastChat's penalty=None (the same unpenalized fit).
    lr = LogisticRegression(fit_intercept=False, C=np.inf, tol=1e-6)
    lr.fit(x, y, sample_weight=weight)
    return lr.coef_[0]


def to_elo(coef: np.ndarray, models: Sequence[str], cfg: RatingConfig) -> np.ndarray:
    """scale * coefficient + initial, shifted so that the anchor (when present) has its rating."""
    elo = cfg.scale * coef + cfg.initial
    if cfg.anchor and cfg.anchor in models:
        elo = elo + cfg.anchor_rating - elo[..., [list(models).index(cfg.anchor)]]
    return elo


def bt_ratings(table: BattleTable, cfg: RatingConfig, counts: np.ndarray | None = None) -> np.ndarray:
    """FastChat's `compute_mle_elo`: one rating per model of `table.models` (NaN for a model with no battle
    among `counts`)."""
    coef = bt_coefficients(half_wins(table, counts), cfg.base)
    elo = to_elo(coef, table.models, cfg)
    played = np.zeros(len(table.models), dtype=bool)
    used = slice(None) if counts is None else counts > 0
    played[table.a[used]] = played[table.b[used]] = True
    return np.where(played, elo, np.nan)


def bootstrap_ratings(table: BattleTable, cfg: RatingConfig, progress=None) -> np.ndarray:
    """[round, model] ratings of `cfg.bootstrap` resamples of the battles (FastChat's get_bootstrap_result)."""
    from threadpoolctl import threadpool_limits  # scikit-learn's own dependency

    rng = np.random.RandomState(cfg.seed)
    n = len(table.a)
    rounds = []
    with threadpool_limits(1):  # fits of a few dozen rows: more BLAS threads only wait on each other
        for _ in range(cfg.bootstrap):
            picked = rng.choice(n, size=n, replace=True)
            rounds.append(bt_ratings(table, cfg, np.bincount(picked, minlength=n)))
            if progress is not None:
                progress.update(1)
    return np.array(rounds).reshape(cfg.bootstrap, len(table.models))


def rank_ranges(lower: np.ndarray, upper: np.ndarray) -> list[tuple[int, int]]:
    """(FastChat's rank, the worst rank the intervals allow) per model: 1 + #models surely better, and
    #models not surely worse (itself included)."""
    n = len(lower)
    out = []
    for i in range(n):
        others = np.arange(n) != i
        best = 1 + int(np.sum(lower[others] > upper[i]))
        worst = n - int(np.sum(upper[others] < lower[i]))
        out.append((best, worst))
    return out


def online_elo(battles: Iterable[dict], cfg: RatingConfig) -> dict[str, float]:
    """FastChat's `compute_online_elo`: one Elo update of step `cfg.k` per battle, in the given order."""
    rating: dict[str, float] = {}
    for r in battles:
        a, b = r["model_a"], r["model_b"]
        ra, rb = rating.setdefault(a, cfg.initial), rating.setdefault(b, cfg.initial)
        ea = 1 / (1 + cfg.base ** ((rb - ra) / cfg.scale))
        eb = 1 / (1 + cfg.base ** ((ra - rb) / cfg.scale))
        sa = SCORE[r["winner"]]
        rating[a] += cfg.k * (sa - ea)
        rating[b] += cfg.k * (1 - sa - eb)
    return rating


def time_order(battles: list[dict]) -> list[dict]:
    """The battles sorted by `tstamp` (stable) when every one has a number there, as FastChat orders them
    before the online Elo; else as given."""
    stamps = [r.get("tstamp") for r in battles]
    if all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) for t in stamps):
        return [r for _, r in sorted(zip(stamps, battles), key=lambda p: p[0])]
    return battles


@dataclasses.dataclass
class ModelRating:
    model: str
    rating: float  # the maximum-likelihood rating on every battle
    median: float  # the bootstrap median (the rating when there is no bootstrap)
    lower: float  # the 2.5th bootstrap percentile
    upper: float  # the 97.5th bootstrap percentile
    rank: int  # FastChat's rank: 1 + #models whose lower bound is above this model's upper bound
    rank_range: tuple[int, int]  # the best and worst ranks the intervals allow
    battles: int
    wins: int
    ties: int
    losses: int
    online_elo: float


def rate(battles: list[dict], cfg: RatingConfig, progress=None) -> list[ModelRating]:
    """Every model's rating, interval, rank range and online Elo, best first (checked battle rows)."""
    cfg.validate()
    table = encode(battles)
    rating = bt_ratings(table, cfg)
    if cfg.bootstrap:
        boot = bootstrap_ratings(table, cfg, progress)
        lower, median, upper = (np.nanpercentile(boot, q, axis=0) for q in (2.5, 50.0, 97.5))
    else:
        lower = median = upper = rating
    ranks = rank_ranges(lower, upper)
    online = online_elo(time_order(battles), cfg)
    n = len(table.models)
    played = np.bincount(table.a, minlength=n) + np.bincount(table.b, minlength=n)
    won = np.bincount(table.a, table.score == 1.0, n) + np.bincount(table.b, table.score == 0.0, n)
    tied = np.bincount(table.a, table.score == 0.5, n) + np.bincount(table.b, table.score == 0.5, n)
    out = [ModelRating(m, float(rating[i]), float(median[i]), float(lower[i]), float(upper[i]), ranks[i][0],
                       ranks[i], int(played[i]), int(won[i]), int(tied[i]), int(played[i] - won[i] - tied[i]),
                       float(online[m]))
           for i, m in enumerate(table.models)]
    return sorted(out, key=lambda r: (-r.rating, r.model))
