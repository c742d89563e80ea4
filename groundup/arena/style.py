"""Style control: Bradley-Terry ratings with answer length and markdown as covariates, as FastChat computes them
(elo_analysis.py: `construct_style_matrices`, `fit_mle_elo`, `get_bootstrap_result_style_control`;
arena-hard-auto's add_markdown_info.py for the counts).

Per answer: its length, and its headers (`# ` to `###### ` at a line start), list items (`1. `, `- `, `* `,
`+ `) and bold spans (`**x**`, `__x__`) outside ``` code blocks. Per battle and feature: (a - b) / (a + b + 1),
standardized over the battles (np.std, ddof 0). Every battle counts twice (a tie: once as model_a's win, once
as its loss), one row [+ln(base) for model_a, -ln(base) for model_b, the four style features], fitted by
scikit-learn's default LogisticRegression without intercept (FastChat keeps its L2 penalty, C = 1 here);
rating = scale * coefficient + initial, then the anchor shift. The bootstrap resamples battles as FastChat
does (numpy's RandomState(seed).choice over battle indices, each drawn battle's two rows kept together).

Differences, both forced: the length is counted in characters, not FastChat's tiktoken tokens (whose
encodings are downloaded); a feature that never varies is left at 0 instead of dividing by a zero deviation.
"""

from __future__ import annotations

import math
import re

import numpy as np

from groundup.arena.ratings import SCORE, RatingConfig, to_elo

STYLE_FEATURES = ("length", "headers", "lists", "bold")
_CODE = re.compile("```([^`]*)```")
_PATTERNS = ([re.compile(rf"^#{{{i}}}\s", re.MULTILINE) for i in range(1, 7)],
             [re.compile(r"^\s*\d+\.\s", re.MULTILINE), re.compile(r"^\s*[-*+]\s", re.MULTILINE)],
             [re.compile(r"\*\*[^*\n]+\*\*"), re.compile(r"__[^_\n]+__")])


def style_counts(answer: str) -> list[int]:
    """[length in characters, headers, list items, bold spans] of one answer (markdown outside code blocks)."""
    text = answer
    for block in _CODE.findall(answer):
        text = text.replace(block, "")
    return [len(answer)] + [sum(len(p.findall(text)) for p in group) for group in _PATTERNS]


def style_matrix(battles: list[dict], models: list[str], base: float) -> tuple[np.ndarray, np.ndarray]:
    """FastChat's construct_style_matrices: X [2n, models + 4] and Y [2n] (battles must hold both answers)."""
    index = {m: i for i, m in enumerate(models)}
    n, p, k = len(battles), len(models), len(STYLE_FEATURES)
    a = np.array([style_counts(r["answer_a"]) for r in battles], dtype=np.float64).T
    b = np.array([style_counts(r["answer_b"]) for r in battles], dtype=np.float64).T
    diff = (a - b) / (a + b + 1.0)
    std = diff.std(axis=1)
    feats = np.zeros_like(diff)
    varies = std > 0
    feats[varies] = (diff[varies] - diff[varies].mean(axis=1, keepdims=True)) / std[varies, None]
    x = np.zeros((2 * n, p + k))
    rows = np.arange(2 * n)
    x[rows, np.tile([index[r["model_a"]] for r in battles], 2)] = math.log(base)
    x[rows, np.tile([index[r["model_b"]] for r in battles], 2)] = -math.log(base)
    x[:, p:] = np.tile(feats.T, (2, 1))
    score = np.array([SCORE[r["winner"]] for r in battles])
    y = np.r_[(score >= 0.5).astype(float), (score == 1.0).astype(float)]  # a tie: a win, then a loss
    return x, y


def fit_style(x: np.ndarray, y: np.ndarray, models: list[str], cfg: RatingConfig) -> tuple[np.ndarray, np.ndarray]:
    """FastChat's fit_mle_elo: (ratings per model, the style coefficients)."""
    from sklearn.linear_model import LogisticRegression  # optional dependency: groundup[arena]

    coef = LogisticRegression(fit_intercept=False).fit(x, y).coef_[0]
    p = len(models)
    elo = to_elo(coef[:p], models, cfg)
    played = x[:, :p].any(axis=0)
    return np.where(played, elo, np.nan), coef[p:]


def style_ratings(battles: list[dict], models: list[str], cfg: RatingConfig, progress=None) -> dict:
    """Style-controlled ratings, their bootstrap rounds and the style coefficients (final and per round)."""
    from threadpoolctl import threadpool_limits  # scikit-learn's own dependency

    x, y = style_matrix(battles, models, cfg.base)
    rating, coef = fit_style(x, y, models, cfg)
    n = len(battles)
    tie = np.array([SCORE[r["winner"]] == 0.5 for r in battles])
    rng = np.random.RandomState(cfg.seed)
    rounds, coefs = [], []
    with threadpool_limits(1):
        for _ in range(cfg.bootstrap):
            picked = rng.choice(n, size=n, replace=True)
            decisive, tied = picked[~tie[picked]], picked[tie[picked]]
            rows = np.concatenate([decisive, decisive, tied, tied + n])
            r, c = fit_style(x[rows], y[rows], models, cfg)
            rounds.append(r)
            coefs.append(c)
            if progress is not None:
                progress.update(1)
    return {"rating": rating, "coef": coef, "bootstrap": np.array(rounds).reshape(cfg.bootstrap, len(models)),
            "bootstrap_coef": np.array(coefs).reshape(cfg.bootstrap, len(STYLE_FEATURES))}
