"""Arena ratings against the tools that define them.

`fschat` from PyPI (0.2.36) predates FastChat's `compute_mle_elo` and its module imports plotly, pytz and
FastChat's model registry, so the reference below is FastChat's own code, copied from the Chatbot Arena
notebook (lmsys blog of 2023-12-07; also arena-hard-auto's show_result.py) line by line: `compute_mle_elo`,
`get_bootstrap_result`, `compute_online_elo` (elo_analysis.py's `compute_elo`) and
`compute_pairwise_win_fraction`. The only edit: `penalty=None` is spelled `C=np.inf`, as scikit-learn 1.8
deprecated the former for the same unpenalized fit. Likewise alpaca_eval's `fit_LogisticRegressionCV`
(alpaca_eval 0.6.6, metrics/glm_winrate.py: its module needs patsy and the Hub) with `penalty="l1"` spelled
`l1_ratios=(1.0,)`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import sklearn
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
from sklearn.metrics import make_scorer
from sklearn.model_selection import GroupKFold

from groundup.arena.battle_log import one_per_battle
from groundup.arena.ratings import RatingConfig, bootstrap_ratings, bt_ratings, encode, online_elo, rank_ranges, rate
from groundup.arena.winrate import fit_glm, length_controlled_all, swap_agreement, win_fraction
from groundup.errors import ConfigError

# ----------------------------------------------------------------------------- FastChat, line by line


def compute_mle_elo(df, SCALE=400, BASE=10, INIT_RATING=1000, sample_weight=None):
    ptbl_a_win = pd.pivot_table(df[df["winner"] == "model_a"], index="model_a", columns="model_b", aggfunc="size",
                                fill_value=0)
    # if no tie, create a zero matrix
    if sum(df["winner"].isin(["tie", "tie (bothbad)"])) == 0:
        ptbl_tie = pd.DataFrame(0, index=ptbl_a_win.index, columns=ptbl_a_win.columns)
    else:
        ptbl_tie = pd.pivot_table(df[df["winner"].isin(["tie", "tie (bothbad)"])], index="model_a",
                                  columns="model_b", aggfunc="size", fill_value=0)
        ptbl_tie = ptbl_tie + ptbl_tie.T
    ptbl_b_win = pd.pivot_table(df[df["winner"] == "model_b"], index="model_a", columns="model_b", aggfunc="size",
                                fill_value=0)
    ptbl_win = ptbl_a_win * 2 + ptbl_b_win.T * 2 + ptbl_tie
    models = pd.Series(np.arange(len(ptbl_win.index)), index=ptbl_win.index)
    p = len(models)
    X = np.zeros([p * (p - 1) * 2, p])
    Y = np.zeros(p * (p - 1) * 2)
    cur_row = 0
    sample_weights = []
    for m_a in ptbl_win.index:
        for m_b in ptbl_win.columns:
            if m_a == m_b:
                continue
            # if nan skip
            if math.isnan(ptbl_win.loc[m_a, m_b]) or math.isnan(ptbl_win.loc[m_b, m_a]):
                continue
            X[cur_row, models[m_a]] = +math.log(BASE)
            X[cur_row, models[m_b]] = -math.log(BASE)
            Y[cur_row] = 1.0
            sample_weights.append(ptbl_win.loc[m_a, m_b])
            X[cur_row + 1, models[m_a]] = math.log(BASE)
            X[cur_row + 1, models[m_b]] = -math.log(BASE)
            Y[cur_row + 1] = 0.0
            sample_weights.append(ptbl_win.loc[m_b, m_a])
            cur_row += 2
    X = X[:cur_row]
    Y = Y[:cur_row]
    lr = LogisticRegression(fit_intercept=False, C=np.inf, tol=1e-6)  # FastChat: penalty=None
    lr.fit(X, Y, sample_weight=sample_weights)
    elo_scores = SCALE * lr.coef_[0] + INIT_RATING
    if "mixtral-8x7b-instruct-v0.1" in models.index:
        elo_scores += 1114 - elo_scores[models["mixtral-8x7b-instruct-v0.1"]]
    return pd.Series(elo_scores, index=models.index).sort_values(ascending=False)


def get_bootstrap_result(battles, func_compute_elo, num_round):
    rows = []
    for i in range(num_round):
        rows.append(func_compute_elo(battles.sample(frac=1.0, replace=True)))
    df = pd.DataFrame(rows)
    return df[df.median().sort_values(ascending=False).index]


def compute_online_elo(battles, K=4, SCALE=400, BASE=10, INIT_RATING=1000):
    from collections import defaultdict

    rating = defaultdict(lambda: INIT_RATING)
    for rd, model_a, model_b, winner in battles[["model_a", "model_b", "winner"]].itertuples():
        ra = rating[model_a]
        rb = rating[model_b]
        ea = 1 / (1 + BASE ** ((rb - ra) / SCALE))
        eb = 1 / (1 + BASE ** ((ra - rb) / SCALE))
        if winner == "model_a":
            sa = 1
        elif winner == "model_b":
            sa = 0
        elif winner == "tie" or winner == "tie (bothbad)":
            sa = 0.5
        else:
            raise Exception(f"unexpected vote {winner}")
        rating[model_a] += K * (sa - ea)
        rating[model_b] += K * (1 - sa - eb)
    return rating


def compute_pairwise_win_fraction(battles, model_order):
    a_win_ptbl = pd.pivot_table(battles[battles["winner"] == "model_a"], index="model_a", columns="model_b",
                                aggfunc="size", fill_value=0)
    b_win_ptbl = pd.pivot_table(battles[battles["winner"] == "model_b"], index="model_a", columns="model_b",
                                aggfunc="size", fill_value=0)
    num_battles_ptbl = pd.pivot_table(battles, index="model_a", columns="model_b", aggfunc="size", fill_value=0)
    row_beats_col_freq = (a_win_ptbl + b_win_ptbl.T) / (num_battles_ptbl + num_battles_ptbl.T)
    return row_beats_col_freq.loc[model_order, model_order]


# ----------------------------------------------------------------------------- simulated battle logs

TRUE = {"alpha": 1180.0, "bravo": 1090.0, "charlie": 1040.0, "delta": 1000.0, "echo": 920.0,
        "mixtral-8x7b-instruct-v0.1": 770.0}


def simulate(n: int, seed: int, tie: float = 0.15, true: dict = TRUE) -> list[dict]:
    """Battles drawn from Bradley-Terry with ties: a tie with probability `tie` (a third of them "both bad"),
    else a win with the probability that makes model_a's expected score its BT probability, so that the
    ratings (ties as half wins) are the MLE's target."""
    rng = np.random.default_rng(seed)
    names = list(true)
    rows = []
    for t in range(n):
        i, j = rng.choice(len(names), 2, replace=False)
        a, b = names[i], names[j]
        p = 1 / (1 + 10 ** ((true[b] - true[a]) / 400))
        if rng.random() < tie:
            winner = "tie (bothbad)" if rng.random() < 1 / 3 else "tie"
        else:
            winner = "model_a" if rng.random() < (p - tie / 2) / (1 - tie) else "model_b"
        rows.append({"model_a": a, "model_b": b, "winner": winner, "tstamp": float(t)})
    return rows


@pytest.fixture(scope="module")
def log():
    return simulate(3000, seed=7)


def test_ratings_equal_fastchats_compute_mle_elo(log):
    ref = compute_mle_elo(pd.DataFrame(log))  # FastChat anchors mixtral-8x7b-instruct-v0.1 at 1114 when present
    table = encode(log)
    ours = bt_ratings(table, RatingConfig(anchor="mixtral-8x7b-instruct-v0.1", anchor_rating=1114.0))
    assert table.models == sorted(TRUE)
    assert np.abs(ref[table.models].to_numpy() - ours).max() < 0.1
    assert ours[table.models.index("mixtral-8x7b-instruct-v0.1")] == pytest.approx(1114.0)
    # Without the anchor, FastChat's fit with the anchor's name changed: the mean rating stays at the initial.
    renamed = pd.DataFrame(log).replace({"mixtral-8x7b-instruct-v0.1": "foxtrot"})
    free = bt_ratings(encode(renamed.to_dict("records")), RatingConfig())
    assert np.abs(compute_mle_elo(renamed).sort_index().to_numpy() - free).max() < 0.1
    assert free.mean() == pytest.approx(1000.0, abs=1e-3)
    # Scale, base and initial are FastChat's arguments.
    odd = bt_ratings(encode(renamed.to_dict("records")), RatingConfig(scale=200.0, base=math.e, initial=1500.0))
    assert np.abs(compute_mle_elo(renamed, 200, math.e, 1500).sort_index().to_numpy() - odd).max() < 0.1


def test_bootstrap_draws_fastchats_resamples(log):
    """With numpy's global seed, FastChat's `battles.sample(frac=1, replace=True)` draws the resamples ours draws."""
    df = pd.DataFrame(log)
    np.random.seed(42)
    ref = get_bootstrap_result(df, compute_mle_elo, num_round=12)
    cfg = RatingConfig(bootstrap=12, seed=42, anchor="mixtral-8x7b-instruct-v0.1")
    ours = bootstrap_ratings(encode(log), cfg)
    models = sorted(TRUE)
    for q in (0.025, 0.5, 0.975):
        assert np.abs(ref.quantile(q)[models].to_numpy() - np.percentile(ours, 100 * q, axis=0)).max() < 0.1


def test_the_fit_recovers_the_true_ratings_within_its_intervals():
    true = {k: v for k, v in TRUE.items() if k != "mixtral-8x7b-instruct-v0.1"}
    mean = sum(true.values()) / len(true)
    true = {k: v - mean + 1000.0 for k, v in true.items()}  # no anchor: the ratings' mean is 1000
    rows = simulate(4000, seed=11, true=true)
    ratings = {r.model: r for r in rate(rows, RatingConfig(bootstrap=40, seed=1))}
    inside = [m for m, r in ratings.items() if r.lower <= true[m] <= r.upper]
    assert len(inside) >= len(true) - 1, {m: (r.lower, true[m], r.upper) for m, r in ratings.items()}
    assert all(abs(r.rating - true[m]) < 30 for m, r in ratings.items())
    assert [r.model for r in rate(rows, RatingConfig(bootstrap=0))] == sorted(true, key=true.get, reverse=True)


def test_online_elo_is_fastchats(log):
    ref = compute_online_elo(pd.DataFrame(log))
    ours = online_elo(log, RatingConfig())
    assert ours.keys() == ref.keys()
    assert max(abs(ours[m] - ref[m]) for m in ref) < 1e-9


def test_rank_is_fastchats_and_the_range_what_the_intervals_allow():
    lower = np.array([1100.0, 1050.0, 1040.0, 900.0])
    upper = np.array([1200.0, 1110.0, 1060.0, 1045.0])
    # FastChat: 1 + the models whose lower bound is above this one's upper bound.
    assert rank_ranges(lower, upper) == [(1, 2), (1, 3), (2, 4), (3, 4)]


def test_model_rows_count_battles_wins_ties_losses():
    rows = [{"model_a": "x", "model_b": "y", "winner": w} for w in ("model_a", "model_a", "tie", "tie (bothbad)",
                                                                   "model_b")]
    by = {r.model: r for r in rate(rows, RatingConfig(bootstrap=0))}
    assert (by["x"].battles, by["x"].wins, by["x"].ties, by["x"].losses) == (5, 2, 2, 1)
    assert (by["y"].wins, by["y"].ties, by["y"].losses) == (1, 2, 2)
    # x scored 3 of 5: BT odds 3:2, i.e. 400 * log10(1.5) Elo points apart, centred on 1000.
    assert by["x"].rating - by["y"].rating == pytest.approx(400 * math.log10(1.5), abs=0.01)
    assert by["x"].rank_range == (1, 1) and by["y"].rank == 2


@pytest.mark.parametrize("key,value", [("scale", 0.0), ("base", 1.0), ("bootstrap", -1), ("k", -1.0),
                                       ("initial", math.nan)])
def test_rating_config_names_the_bad_key(key, value):
    with pytest.raises(ConfigError) as e:
        RatingConfig(**{key: value}).validate()
    assert e.value.key == key


def test_win_fraction_is_fastchats(log):
    decisive = [r for r in log if "tie" not in r["winner"]]
    models = sorted(TRUE)
    ref = compute_pairwise_win_fraction(pd.DataFrame(decisive), models).to_numpy()
    ours = win_fraction(log, models)
    assert np.allclose(np.nan_to_num(ref, nan=-1), np.nan_to_num(ours, nan=-1))


# ----------------------------------------------------------------------------- the swap


def test_two_orders_become_one_battle_and_agreement_is_counted():
    def row(bid, swap, winner, judge="j"):
        return {"battle_id": bid, "model_a": "x", "model_b": "y", "winner": winner, "swap": swap, "judge": judge}

    rows = [row("1", False, "model_a"), row("1", True, "model_a"),   # x both ways: x wins
            row("2", False, "model_a"), row("2", True, "model_b"),   # each picked the first shown: a tie
            row("3", False, "tie (bothbad)"), row("3", True, "tie (bothbad)"),
            row("4", False, "model_b"),                              # its other order is missing: kept alone
            {"model_a": "y", "model_b": "x", "winner": "model_b"}]   # a human vote: no swap
    combined = one_per_battle(rows)
    assert [r["winner"] for r in combined] == ["model_a", "tie", "tie (bothbad)", "model_b", "model_b"]
    assert swap_agreement(rows) == {"j": {"pairs": 3, "agree": 2, "agreement": 2 / 3, "decisive": 5,
                                          "first_shown_won": 3 / 5}}


# ----------------------------------------------------------------------------- AlpacaEval 2's length control


def logloss(y_true, y_pred, sample_weight=None):
    epsilon = 1e-15
    y_pred = np.clip(y_pred, epsilon, 1 - epsilon)
    all_logloss = y_true * np.log(y_pred) + (1 - y_true) * np.log(1 - y_pred)
    if sample_weight is not None:
        all_logloss = all_logloss * sample_weight
    return -np.mean(all_logloss)


def logloss_continuous(y_true, y_pred, true_prob, true_sample_weight=None):
    y_true = np.where(y_true == 1, true_prob, 1 - true_prob)
    return logloss(y_true, y_pred, sample_weight=true_sample_weight)


def fit_LogisticRegressionCV(data, col_y_true, n_splits=5, **kwargs):  # alpaca_eval's, is_ytrue_proba=True
    dflt_kwargs = dict(random_state=123, dual=False, l1_ratios=(1.0,), solver="liblinear", n_jobs=None,
                       fit_intercept=False, use_legacy_attributes=False)
    data = data.reset_index(drop=True).reset_index(drop=False, names=["group"])
    data_1 = data.copy()
    data_1["y"] = 1
    data_0 = data.copy()
    data_0[col_y_true] = 1 - data_0[col_y_true]
    data_0["y"] = 0
    data_dup = pd.concat([data_1, data_0], axis=0).reset_index(drop=True)
    true_prob = data_dup[col_y_true]
    true_sample_weight = None
    sample_weight = true_prob
    cv = GroupKFold(n_splits=n_splits)
    scorer = make_scorer(logloss_continuous, response_method="predict_proba",
                         greater_is_better=False).set_score_request(true_sample_weight=True, true_prob=True)
    model = LogisticRegressionCV(cv=cv, scoring=scorer, **dflt_kwargs)
    fit_kwargs = dict(groups=data_dup["group"], true_sample_weight=true_sample_weight, true_prob=true_prob)
    model.set_fit_request(sample_weight=True)
    model.fit(X=data_dup.drop(columns=[col_y_true, "y", "group"]), y=data_dup["y"], sample_weight=sample_weight,
              **fit_kwargs)
    return model


def test_glm_fit_is_alpaca_evals():
    rng = np.random.default_rng(0)
    n = 240
    x = np.column_stack([np.tanh(rng.normal(size=n)), rng.normal(size=n), np.ones(n)])
    p = (rng.random(n) < 1 / (1 + np.exp(-(x @ [1.2, 0.5, 0.3])))).astype(float)
    p[rng.random(n) < 0.1] = 0.5
    data = pd.DataFrame(x, columns=["np.tanh(std_delta_len)", "instruction_difficulty", "not_gamed_baseline"])
    data["preference"] = p
    with sklearn.config_context(enable_metadata_routing=True):
        ref = fit_LogisticRegressionCV(data, "preference").coef_[0]
    assert np.allclose(fit_glm(x, p, np.arange(n)), ref, atol=1e-9)


def test_length_controlled_win_rate_removes_a_planted_length_bias():
    """`long` is as good as the baseline but 300 characters longer on average, and the judge likes length
    (the GLM's own form: -1.5 tanh(std_delta_len)): it wins about 7 in 10 raw, about half length-controlled.
    `good` is better at the baseline's length: both its rates stay high. Over seeds 3-8 the `long` LC win
    rate stays within 6 points of 50 (the GLM's sampling error at 300 battles)."""
    rng = np.random.default_rng(4)
    n = 300
    base = rng.integers(200, 900, n)
    rows = []
    for model, skill, extra in (("long", 0.0, 300), ("good", 1.0, 0)):
        length = np.maximum(20, base + extra + rng.normal(0, 250, n).astype(int))
        delta = base - length
        term = np.tanh(delta / delta.std(ddof=1))
        for q in range(n):
            p = 1 / (1 + math.exp(-(skill - 1.5 * term[q])))
            winner = "tie" if rng.random() < 0.08 else ("model_a" if rng.random() < p else "model_b")
            rows.append({"battle_id": f"{model}-{q}", "question_id": f"q{q}", "model_a": model, "model_b": "base",
                         "winner": winner, "answer_a": "x" * int(length[q]), "answer_b": "y" * int(base[q])})
    lc = length_controlled_all(rows, "base", ["good", "long", "base"])
    assert lc["long"]["win_rate"] > 65
    assert abs(lc["long"]["length_controlled_winrate"] - 50) < 8
    assert lc["good"]["win_rate"] > 65 and lc["good"]["length_controlled_winrate"] > 62
    assert lc["long"]["weights"]["length"] < -0.5  # std_delta_len is baseline minus model: longer wins, negative
    assert "instruction_difficulty" in lc["long"]["formula"] and lc["long"]["n_glm"] == n
    # Without both answers there is nothing to control for: the GLM is not fitted, the raw rate stays.
    bare = [{k: v for k, v in r.items() if k != "answer_a"} for r in rows]
    only_raw = length_controlled_all(bare, "base", ["long"])["long"]
    assert only_raw["win_rate"] == lc["long"]["win_rate"] and math.isnan(only_raw["length_controlled_winrate"])


# ----------------------------------------------------------------------------- style control, FastChat's


def count_markdown_elements(markdown_text, suffix):  # arena-hard-auto's utils/add_markdown_info.py
    import re

    return {
        f"header_count{suffix}": {f"h{i}": len(re.findall(rf"^#{{{i}}}\s", markdown_text, re.MULTILINE))
                                  for i in range(1, 7)},
        f"list_count{suffix}": {"ordered": len(re.findall(r"^\s*\d+\.\s", markdown_text, re.MULTILINE)),
                                "unordered": len(re.findall(r"^\s*[-*+]\s", markdown_text, re.MULTILINE))},
        f"bold_count{suffix}": {"**": len(re.findall(r"\*\*[^*\n]+\*\*", markdown_text)),
                                "__": len(re.findall(r"__[^_\n]+__", markdown_text))},
    }


def remove_pattern(answer, pattern):
    blocks = pattern.findall(answer)
    for block in blocks:
        answer = answer.replace(block, "")
    return answer


STYLE_CONTROL_ELEMENTS_V1 = ["sum_assistant_a_tokens", "header_count_a", "list_count_a", "bold_count_a",
                             "sum_assistant_b_tokens", "header_count_b", "list_count_b", "bold_count_b"]


def construct_style_matrices(df, BASE=10, apply_ratio=[1, 1, 1, 1], style_elements=STYLE_CONTROL_ELEMENTS_V1,
                             add_one=True):
    models = pd.concat([df["model_a"], df["model_b"]]).unique()
    models = pd.Series(np.arange(len(models)), index=models)
    df = pd.concat([df, df], ignore_index=True)
    p = len(models.index)
    n = df.shape[0]
    k = int(len(style_elements) / 2)
    X = np.zeros([n, p + k])
    X[np.arange(n), models[df["model_a"]]] = +math.log(BASE)
    X[np.arange(n), models[df["model_b"]]] = -math.log(BASE)
    style_vector = np.array([df.conv_metadata.map(
        lambda x: x[element] if type(x[element]) is int else sum(x[element].values())).tolist()
        for element in style_elements])
    style_diff = (style_vector[:k] - style_vector[k:]).astype(float)
    style_sum = (style_vector[:k] + style_vector[k:]).astype(float)
    if add_one:
        style_sum = style_sum + np.ones(style_diff.shape)
    apply_ratio = np.flatnonzero(apply_ratio)
    style_diff[apply_ratio] /= style_sum[apply_ratio]
    style_mean = np.mean(style_diff, axis=1)
    style_std = np.std(style_diff, axis=1)
    X[:, -k:] = ((style_diff - style_mean[:, np.newaxis]) / style_std[:, np.newaxis]).T
    Y = np.zeros(n)
    Y[df["winner"] == "model_a"] = 1.0
    tie_idx = ((df["winner"] == "tie") | (df["winner"] == "tie (bothbad)")).to_numpy().copy()  # pandas 3: CoW
    tie_idx[len(tie_idx) // 2:] = False
    Y[tie_idx] = 1.0
    return X, Y, models


def fit_mle_elo(X, Y, models, indices=None, SCALE=400, INIT_RATING=1000):
    p = len(models.index)
    lr = LogisticRegression(fit_intercept=False)
    if indices:
        lr.fit(X[indices], Y[indices])
    else:
        lr.fit(X, Y)
    elo_scores = SCALE * lr.coef_[0] + INIT_RATING
    if "mixtral-8x7b-instruct-v0.1" in models.index:
        elo_scores += 1114 - elo_scores[models["mixtral-8x7b-instruct-v0.1"]]
    return pd.Series(elo_scores[:p], index=models.index).sort_values(ascending=False), lr.coef_[0][p:]


def get_bootstrap_result_style_control(X, Y, battles, models, func_compute_elo, num_round=1000):
    elos, coefs = [], []
    k = int(X.shape[0] / 2)
    battles_tie_idx = ((battles["winner"] == "tie") | (battles["winner"] == "tie (bothbad)")).to_numpy()
    for _ in range(num_round):
        indices = np.random.choice(list(range(k)), size=(k), replace=True)
        index2tie = np.zeros(k, dtype=bool)
        index2tie[battles_tie_idx] = True
        nontie_indices = indices[~index2tie[indices]]
        tie_indices = np.concatenate([indices[index2tie[indices]], indices[index2tie[indices]] + k])
        _X = np.concatenate([X[nontie_indices], X[nontie_indices], X[tie_indices]])
        _Y = np.concatenate([Y[nontie_indices], Y[nontie_indices], Y[tie_indices]])
        states = ~_X[:, : len(models)].any(axis=0)
        elo, coef = func_compute_elo(_X, _Y, models=models[~states])
        elos.append(elo)
        coefs.append(coef)
    df = pd.DataFrame(elos)
    return df[df.median().sort_values(ascending=False).index], coefs


def styled_log(n: int, seed: int) -> list[dict]:
    """Battles whose judge likes long, bold, listed answers; `verbose` writes them, `terse` does not."""
    from groundup.arena.style import style_counts

    rng = np.random.default_rng(seed)
    habits = {"terse": (80, 0.1), "plain": (200, 0.3), "verbose": (500, 0.8)}
    names = list(habits)

    def answer(model):
        length, markdown = habits[model]
        lines = ["word " * int(rng.integers(length // 2, length) // 5)]
        if rng.random() < markdown:
            lines += ["## Heading", "- **a point**", "1. a step", "```\n# not a heading\n```"]
        return "\n".join(lines)

    rows = []
    for t in range(n):
        i, j = rng.choice(3, 2, replace=False)
        a, b = names[i], names[j]
        ans_a, ans_b = answer(a), answer(b)
        ca, cb = style_counts(ans_a), style_counts(ans_b)
        logit = 1.2 * (ca[0] - cb[0]) / (ca[0] + cb[0] + 1) + 0.4 * (ca[3] - cb[3])
        p = 1 / (1 + math.exp(-logit))
        winner = "tie" if rng.random() < 0.1 else ("model_a" if rng.random() < p else "model_b")
        rows.append({"model_a": a, "model_b": b, "winner": winner, "answer_a": ans_a, "answer_b": ans_b})
    return rows


def test_style_control_is_fastchats():
    import re

    from groundup.arena.style import style_ratings

    rows = styled_log(600, seed=5)
    code = re.compile("```([^`]*)```")
    df = pd.DataFrame(rows)
    df["conv_metadata"] = [{"sum_assistant_a_tokens": len(r["answer_a"]), "sum_assistant_b_tokens": len(r["answer_b"]),
                            **count_markdown_elements(remove_pattern(r["answer_a"], code), "_a"),
                            **count_markdown_elements(remove_pattern(r["answer_b"], code), "_b")} for r in rows]
    X, Y, models = construct_style_matrices(df)
    ref, ref_coef = fit_mle_elo(X, Y, models)
    np.random.seed(3)
    boot, _ = get_bootstrap_result_style_control(X, Y, df, models, fit_mle_elo, num_round=8)
    names = sorted(models.index)
    ours = style_ratings(rows, names, RatingConfig(bootstrap=8, seed=3))
    assert np.abs(ref[names].to_numpy() - ours["rating"]).max() < 0.1
    assert np.allclose(ref_coef, ours["coef"], atol=1e-3)
    assert np.abs(boot[names].quantile(0.975).to_numpy() - np.percentile(ours["bootstrap"], 97.5, axis=0)).max() < 0.1
    # The judge's taste for length and bold shows up as positive coefficients; verbose gains less without them.
    assert ours["coef"][0] > 0 and ours["coef"][3] > 0
    plain = bt_ratings(encode(rows), RatingConfig())
    gap = lambda r: r[names.index("verbose")] - r[names.index("terse")]  # noqa: E731
    assert gap(ours["rating"]) < gap(plain) - 20
