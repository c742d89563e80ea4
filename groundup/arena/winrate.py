"""Win rates from battle rows: the pairwise matrix, battles per pair, the judge's consistency across the swap,
and the length-controlled win rate against a baseline as AlpacaEval 2 defines it.

Length control (Dubois et al. 2024, alpaca_eval/metrics/glm_winrate.py, `length_controlled_v1`): for one
model against the baseline, the preference p (1 the model wins, 0 the baseline, 0.5 a tie) is fitted by
a logistic GLM without intercept on

    tanh(std_delta_len) + instruction_difficulty + 1

where std_delta_len is (len(baseline answer) - len(model answer)) in characters over its standard
deviation across the battles, and instruction_difficulty a per-question number. As alpaca_eval's
`fit_LogisticRegressionCV` does, p is fitted as a probability (each row twice, label 1 weighted p and
label 0 weighted 1 - p) by LogisticRegressionCV with an L1 penalty (liblinear, random_state 123),
choosing C by 5-fold GroupKFold on the log loss. The length-controlled win rate is the mean prediction
with the length term at zero: mean over battles of logistic(w_1 + w_difficulty * difficulty) * 100.

What differs, because alpaca_eval downloads both from the Hub: its instruction difficulties were fitted
once across its leaderboard's models on its 805 instructions; here a question's difficulty is its effect in
a logistic model of the OTHER models' preferences against the baseline (per model an effect and a length
term, per question an effect, L2), so that a model's own verdicts do not leak into its covariate. When no
other model met the baseline on its `question_id`s, the formula is alpaca_eval's `length_controlled_minimal`
(no difficulty term). The regularization towards its "gamed" baselines (length_controlled_v1's lambda 0.2)
needs their Hub annotations and is left out, which is alpaca_eval's `length_controlled_noreg`.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

TIES = ("tie", "tie (bothbad)")
MIN_CV_GROUPS = 5  # alpaca_eval's n_splits: with fewer battles the GLM is fitted once with C = 100


def winner_model(row: dict) -> str | None:
    """The model that won the battle, None for a tie."""
    return None if row["winner"] in TIES else row[row["winner"]]


def pair_counts(rows: list[dict], models: list[str]) -> np.ndarray:
    """[i, j]: battles between models i and j (either order, ties included); symmetric."""
    index = {m: i for i, m in enumerate(models)}
    out = np.zeros((len(models), len(models)), dtype=np.int64)
    for r in rows:
        i, j = index[r["model_a"]], index[r["model_b"]]
        out[i, j] += 1
        out[j, i] += 1
    return out


def win_fraction(rows: list[dict], models: list[str]) -> np.ndarray:
    """[i, j]: the share of the decisive battles between i and j that i won (FastChat's
    compute_pairwise_win_fraction on the battles without ties); NaN where they never had one."""
    index = {m: i for i, m in enumerate(models)}
    wins = np.zeros((len(models), len(models)))
    for r in rows:
        won = winner_model(r)
        if won is not None:
            lost = r["model_b"] if won == r["model_a"] else r["model_a"]
            wins[index[won], index[lost]] += 1
    total = wins + wins.T
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, wins / total, np.nan)


def preference(row: dict, model: str) -> float:
    """`model`'s score in the battle: 1 a win, 0.5 a tie, 0 a loss."""
    won = winner_model(row)
    return 0.5 if won is None else float(won == model)


def against(rows: list[dict], model: str, baseline: str) -> list[dict]:
    return [r for r in rows if {r["model_a"], r["model_b"]} == {model, baseline}]


def raw_win_rate(rows: list[dict], model: str, baseline: str) -> dict:
    """AlpacaEval's win rate (ties count half) of `model` against `baseline`, in percent, with its standard error."""
    prefs = np.array([preference(r, model) for r in against(rows, model, baseline)])
    return {"win_rate": 100 * float(prefs.mean()) if len(prefs) else math.nan,
            "standard_error": 100 * _sem(prefs), "n_total": len(prefs),
            "n_wins": int((prefs == 1).sum()), "n_wins_base": int((prefs == 0).sum()),
            "n_draws": int((prefs == 0.5).sum())}


def _sem(x: np.ndarray) -> float:
    """pandas' Series.sem(): the standard error of the mean with ddof = 1."""
    return float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan


def _answer(row: dict, model: str) -> str | None:
    text = row.get("answer_a") if row["model_a"] == model else row.get("answer_b")
    return text if isinstance(text, str) else None


def _duplicated(x: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """alpaca_eval's trick for probabilistic labels: each row once as label 1 weighted p, once as 0 weighted 1 - p."""
    return np.vstack([x, x]), np.r_[np.ones(len(p)), np.zeros(len(p))], np.r_[p, 1 - p]


def _logloss_continuous(y_true, y_pred, true_prob, true_sample_weight=None):
    """alpaca_eval's scorer: the log loss against the probabilistic labels (y_true only says which copy)."""
    y_true = np.where(y_true == 1, true_prob, 1 - true_prob)
    y_pred = np.clip(y_pred, 1e-15, 1 - 1e-15)
    loss = y_true * np.log(y_pred) + (1 - y_true) * np.log(1 - y_pred)
    return -np.mean(loss if true_sample_weight is None else loss * true_sample_weight)


def fit_glm(x: np.ndarray, p: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """alpaca_eval's fit_LogisticRegressionCV(is_ytrue_proba=True): the GLM's weights for the columns of x."""
    import sklearn  # optional dependency: groundup[arena]
    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
    from sklearn.metrics import make_scorer
    from sklearn.model_selection import GroupKFold

    xx, y, w = _duplicated(x, p)
    if len(set(groups.tolist())) < MIN_CV_GROUPS:
        model = LogisticRegression(C=100, l1_ratio=1.0, solver="liblinear", random_state=123, fit_intercept=False)
        return model.fit(xx, y, sample_weight=w).coef_[0]
    true_prob = w  # alpaca_eval's data_dup[col_y_true]: p for the label-1 copy, 1 - p for the label-0 copy
    with sklearn.config_context(enable_metadata_routing=True):
        scorer = make_scorer(_logloss_continuous, response_method="predict_proba",
                             greater_is_better=False).set_score_request(true_sample_weight=True, true_prob=True)
        model = LogisticRegressionCV(cv=GroupKFold(n_splits=MIN_CV_GROUPS), scoring=scorer, l1_ratios=(1.0,),
                                     solver="liblinear", random_state=123, fit_intercept=False,
                                     use_legacy_attributes=False)
        model.set_fit_request(sample_weight=True)
        model.fit(xx, y, sample_weight=w, groups=np.r_[groups, groups], true_prob=true_prob, true_sample_weight=None)
    return model.coef_[0]


def _length_term(battles: list[dict], model: str, baseline: str) -> np.ndarray:
    """tanh(std_delta_len): (len(baseline answer) - len(model answer)) over its standard deviation, tanh'ed."""
    delta = np.array([len(_answer(r, baseline)) - len(_answer(r, model)) for r in battles], dtype=np.float64)
    std = float(np.std(delta, ddof=1)) if len(delta) > 1 else 0.0
    return np.tanh(delta / std) if std > 0 else np.zeros(len(delta))


def _with_answers(rows: list[dict], model: str, baseline: str) -> list[dict]:
    return [r for r in against(rows, model, baseline)
            if _answer(r, model) is not None and _answer(r, baseline) is not None]


def instruction_difficulty(rows: list[dict], baseline: str, models: list[str]) -> dict[str, float]:
    """Per question_id, its effect in one logistic model of `models`' preferences against the baseline (per
    model: its own effect and its own length term, as in AlpacaEval's joint GLM; per question: its effect;
    L2); {} when none of them has a battle with a question_id and both answers."""
    from sklearn.linear_model import LogisticRegression  # optional dependency: groundup[arena]

    parts = []
    for model in models:
        battles = [r for r in _with_answers(rows, model, baseline) if isinstance(r.get("question_id"), str)]
        if battles:
            parts.append((model, battles, _length_term(battles, model, baseline)))
    seen: dict[str, set] = defaultdict(set)
    for model, battles, _ in parts:
        for r in battles:
            seen[r["question_id"]].add(model)
    if not seen:
        return {}
    questions = {q: i for i, q in enumerate(sorted(seen))}
    k, n = len(parts), sum(len(b) for _, b, _ in parts)
    x, p, row = np.zeros((n, 2 * k + len(questions))), np.zeros(n), 0
    for m, (model, battles, length) in enumerate(parts):
        for r, term in zip(battles, length):
            x[row, m], x[row, k + m], x[row, 2 * k + questions[r["question_id"]]] = 1.0, term, 1.0
            p[row] = preference(r, model)
            row += 1
    xx, y, w = _duplicated(x, p)
    coef = LogisticRegression(C=1.0, fit_intercept=False).fit(xx, y, sample_weight=w).coef_[0]
    return {q: float(coef[2 * k + i]) for q, i in questions.items()}


def length_controlled(rows: list[dict], model: str, baseline: str, difficulty: dict[str, float]) -> dict:
    """AlpacaEval 2's length-controlled win rate of `model` against `baseline` (see the module docstring),
    next to the raw one; battles without both answers are left out of the GLM and counted."""
    battles = _with_answers(rows, model, baseline)
    out = {**raw_win_rate(rows, model, baseline), "n_glm": len(battles)}
    if len(battles) < 2:
        return {**out, "length_controlled_winrate": math.nan, "lc_standard_error": math.nan,
                "formula": "too few battles with both answers"}
    p = np.array([preference(r, model) for r in battles])
    length = _length_term(battles, model, baseline)
    use_difficulty = any(r.get("question_id") in difficulty for r in battles)
    diff = np.array([difficulty.get(r.get("question_id"), 0.0) for r in battles])
    columns = [length, *([diff] if use_difficulty else []), np.ones(len(p))]
    ids: dict = {}  # the two orders of one battle stay in one fold
    groups = np.array([ids.setdefault(r.get("battle_id") or ("row", i), len(ids)) for i, r in enumerate(battles)])
    weights = fit_glm(np.column_stack(columns), p, groups)
    logit = weights[-1] + (weights[1] * diff if use_difficulty else 0.0)
    predicted = 1.0 / (1.0 + np.exp(-logit)) * np.ones(len(p))
    formula = "np.tanh(std_delta_len) + " + ("instruction_difficulty + " if use_difficulty else "") + \
              "not_gamed_baseline.astype(float) - 1"
    return {**out, "length_controlled_winrate": 100 * float(predicted.mean()),
            "lc_standard_error": 100 * _sem(predicted), "formula": formula,
            "weights": {"length": float(weights[0]), "difficulty": float(weights[1]) if use_difficulty else None,
                        "model": float(weights[-1])}}


def length_controlled_all(rows: list[dict], baseline: str, models: list[str]) -> dict[str, dict]:
    """{model: length_controlled(...)} for every model that met `baseline`. A model's instruction
    difficulties come from the other models' battles only, so that its own verdicts do not leak into the
    covariate (AlpacaEval's come from its whole leaderboard, where one model's share is small)."""
    models = [m for m in models if m != baseline and against(rows, m, baseline)]
    return {m: length_controlled(rows, m, baseline,
                                 instruction_difficulty(rows, baseline, [o for o in models if o != m]))
            for m in models}


def swap_agreement(rows: list[dict]) -> dict[str, dict]:
    """Per judge, how often its two verdicts on one battle (swap false and true, sharing a battle_id, else a
    question_id, the turn and the two models) name the same winner or both a tie, and how often a decisive
    verdict picked the answer shown first (0.5 is no position bias)."""
    orders: dict[tuple, dict[bool, dict]] = defaultdict(dict)
    first: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        swap = r.get("swap")
        if not isinstance(swap, bool):
            continue
        judge = str(r.get("judge") or "")
        won = winner_model(r)
        if won is not None:
            shown_first = r["model_b"] if swap else r["model_a"]
            first[judge][0] += won == shown_first
            first[judge][1] += 1
        if r.get("battle_id"):
            key = (judge, "battle", r["battle_id"])
        elif r.get("question_id"):
            key = (judge, "question", r["question_id"], str(r.get("turn", "")), *sorted((r["model_a"], r["model_b"])))
        else:
            continue
        orders[key][swap] = r
    out: dict[str, dict] = {}
    for judge in sorted({k[0] for k in orders} | set(first)):
        both = [o for k, o in orders.items() if k[0] == judge and len(o) == 2]
        agree = sum(winner_model(o[False]) == winner_model(o[True]) for o in both)
        picked, decisive = first[judge]
        out[judge] = {"pairs": len(both), "agree": agree, "agreement": agree / len(both) if both else math.nan,
                      "decisive": decisive, "first_shown_won": picked / decisive if decisive else math.nan}
    return out
