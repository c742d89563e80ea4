"""Log-likelihood scoring and metrics of `groundup eval`: against a full forward pass, lm-eval's own
tokenisation and statistics, and constructed cases with known answers."""

from __future__ import annotations

import math
import random

import pytest
import torch

from conftest import MLA
from groundup.eval.harness import EvalSettings, aggregate, evaluate_task
from groundup.eval.metrics import (bootstrap_stderr, centered, choice_metrics, mean_stderr, perplexity,
                                   perplexity_of)
from groundup.eval.scoring import encode_pair, encode_requests, score_requests
from groundup.benchmarks import get_task
from infer_helpers import small_tokenizer, tiny_model

WORDS = "to be or not that is the question whether tis nobler in the mind to suffer".split()


def random_requests(seed: int, n_items: int = 14):
    """Items of 1-4 choices: shared contexts (whose choices may start alike, or repeat), contexts
    sharing all but their ends, trailing spaces."""
    rnd = random.Random(seed)
    requests, groups = [], []
    for _ in range(n_items):
        base = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(0, 25)))
        shared = rnd.random() < 0.6
        lead = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 3))) if rnd.random() < 0.5 else ""
        group = []
        for _ in range(rnd.randint(1, 4)):
            ctx = base + ("" if shared else rnd.choice(["", " x", " y z", ":"])) + rnd.choice(["", " ", "  "])
            words = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 6)))
            group.append(len(requests))
            requests.append((ctx, " " + (f"{lead} {words}" if lead else words)))
        if rnd.random() < 0.2:  # a repeated choice
            group.append(len(requests))
            requests.append(requests[-1])
        groups.append(group)
    return requests, groups


def direct(model, enc):
    """(sum of log p, greedy) of one request by a plain forward pass and a full log-softmax."""
    ids = torch.tensor(enc.context + enc.continuation)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[None, :-1]).logits[0].double(), dim=-1)
    n = len(enc.continuation)
    target = ids[-n:]
    return float(logp[-n:].gather(1, target[:, None]).sum()), bool((logp[-n:].argmax(-1) == target).all())


@pytest.mark.parametrize("variant", [{}, MLA, {"final_logit_softcap": 10.0, "n_kv_heads": 1}])
def test_loglikelihoods_equal_a_full_forward_pass(variant):
    tok = small_tokenizer()
    model = tiny_model(1, init_std=0.2, max_seq_len=40, **variant)
    requests, groups = random_requests(0)
    encoded = encode_requests(tok, requests, max_len=40)  # a short context: some requests are left-truncated
    assert any(e.truncated for e in encoded) and all(e.error is None for e in encoded)
    expected = [direct(model, e) for e in encoded]
    for batch_size, grouping in ((32, groups), (3, groups), (5, None)):
        scores = score_requests(model, encoded, batch_size=batch_size, groups=grouping)
        for e, s, (lp, greedy) in zip(encoded, scores, expected):
            assert s.logprob == pytest.approx(lp, abs=1e-4)
            assert s.greedy == greedy and s.tokens == len(e.continuation)
    cheap = score_requests(model, encoded, batch_size=8, groups=groups, greedy=False)
    assert all(c.greedy is None and c.logprob == pytest.approx(lp, abs=1e-4) for c, (lp, _) in zip(cheap, expected))


def test_greedy_continuations_are_flagged():
    tok = small_tokenizer()
    model = tiny_model(2, init_std=0.2)
    context = tok.encode("to be or not to be")
    ids = list(context)
    with torch.no_grad():
        for _ in range(4):  # the model's own greedy continuation
            ids.append(int(model(torch.tensor([[tok.eot_id] + ids])).logits[0, -1].argmax()))
    from groundup.eval.scoring import Encoded

    greedy = Encoded([tok.eot_id] + context, ids[len(context):])
    other = Encoded([tok.eot_id] + context, ids[len(context):-1] + [(ids[-1] + 1) % tok.vocab_size])
    a, b = score_requests(model, [greedy, other])
    assert a.greedy is True and b.greedy is False


class _LmEvalStub:
    """lm-eval's TemplateLM with groundup's tokenizer: its own `loglikelihood` and `_encode_pair`."""

    def __new__(cls, tok):
        from lm_eval.api.model import TemplateLM

        class Stub(TemplateLM):
            eot_token_id = property(lambda self: tok.eot_id)

            def tok_encode(self, string, add_special_tokens=None, **kwargs):
                return ([] if add_special_tokens is False else [tok.eot_id]) + tok.encode(string)

            def _loglikelihood_tokens(self, requests, **kwargs):
                return [(ctx, cont) for _, ctx, cont in requests]

            def loglikelihood_rolling(self, requests, disable_tqdm=False):
                raise NotImplementedError

            def generate_until(self, requests, disable_tqdm=False):
                raise NotImplementedError

        return Stub()


def test_tokenisation_equals_lm_eval_encode_pair():
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    tok = small_tokenizer()
    requests, _ = random_requests(3, 30)
    requests += [("", " alone"), ("", "alone"), ("Answer:  ", "yes"), ("a\n", " b"), ("x", "")]
    theirs = _LmEvalStub(tok).loglikelihood([Instance("loglikelihood", {}, r, 0) for r in requests],
                                             disable_tqdm=True)
    ours = [encode_pair(tok, c, x, [tok.eot_id]) for c, x in requests]
    assert ours == [tuple(t) for t in theirs]
    encoded = encode_requests(tok, requests, 1000)
    assert encoded[-1].error and "no tokens" in encoded[-1].error  # lm-eval would assert: we count it
    long = encode_requests(tok, [("to be " * 40, " or not")], max_len=16)[0]
    assert len(long.context) + len(long.continuation) == 17 and long.truncated > 0  # lm-eval keeps max_len + 1


def test_choice_metrics_on_a_constructed_case():
    # 10 chars / 10 bytes, 5 chars / 5 bytes, 5 chars / 10 bytes (é is two bytes in UTF-8)
    choices = ["aaaaaaaaaa", "bbbbb", "ééééé"]
    lls = [-9.0, -5.2, -5.5]  # total: choice 1; per character: choice 0 (-0.9); per byte: choice 2 (-0.55)
    assert choice_metrics(lls, choices, gold=1) == {"acc": 1.0, "acc_norm": 0.0, "acc_bytes": 0.0}
    assert choice_metrics(lls, choices, gold=0) == {"acc": 0.0, "acc_norm": 1.0, "acc_bytes": 0.0}
    assert choice_metrics(lls, choices, gold=2) == {"acc": 0.0, "acc_norm": 0.0, "acc_bytes": 1.0}
    assert choice_metrics([-1.0, -1.0], ["x", "y"], 1)["acc"] == 0.0  # ties: the first, as numpy's argmax


def test_stderr_and_bootstrap_equal_lm_eval(monkeypatch):
    pytest.importorskip("lm_eval")
    from lm_eval.api import metrics as lm

    monkeypatch.setenv("DISABLE_MULTIPROC", "1")
    rnd = random.Random(0)
    accs = [float(rnd.random() < 0.3) for _ in range(57)]
    assert mean_stderr(accs) == pytest.approx(lm.mean_stderr(accs), rel=1e-12)
    lls = [-rnd.random() * 4 for _ in range(41)]
    assert perplexity(lls) == pytest.approx(lm.perplexity(lls), rel=1e-12)
    ours = bootstrap_stderr(perplexity_of, lls, iters=3000)
    assert ours == pytest.approx(lm.bootstrap_stderr(lm.perplexity, lls, iters=3000), rel=1e-9)
    assert math.isnan(mean_stderr([1.0]))


def test_aggregate_is_chance_centred():
    assert centered(0.25, 0.25) == 0.0 and centered(1.0, 0.25) == 1.0 and centered(0.625, 0.5) == 0.25
    results = {
        "a": {"kind": "multiple_choice", "scored": 10, "lm_eval_metrics": ["acc", "acc_norm"], "random_baseline": 0.25,
              "metrics": {"acc": {"value": 0.4}, "acc_norm": {"value": 0.625}}},
        "b": {"kind": "multiple_choice", "scored": 10, "lm_eval_metrics": ["acc"], "random_baseline": 0.5,
              "metrics": {"acc": {"value": 0.75}, "acc_norm": {"value": 0.0}}},
        "c": {"kind": "loglikelihood", "scored": 10, "lm_eval_metrics": ["perplexity", "acc"], "random_baseline": 0.0,
              "metrics": {"acc": {"value": 0.9}}},
    }
    agg = aggregate(results)
    assert agg["tasks"]["a"]["metric"] == "acc_norm" and agg["tasks"]["b"]["metric"] == "acc"
    assert agg["value"] == pytest.approx((0.5 + 0.5) / 2) and "c" not in agg["tasks"]
    assert aggregate({"c": results["c"]}) is None


def test_lambada_greedy_accuracy_and_perplexity():
    tok = small_tokenizer()
    model = tiny_model(3, init_std=0.2)
    task = get_task("lambada_openai")
    r = evaluate_task(model, tok, task, EvalSettings(limit=4, bootstrap_iters=200), progress=False)
    items = task.items(limit=4)
    encoded = encode_requests(tok, [it.requests()[0] for it in items], model.cfg.max_seq_len)
    expected = [direct(model, e) for e in encoded]
    assert [rec["lls"][0] for rec in r["records"]] == pytest.approx([lp for lp, _ in expected], abs=1e-4)
    assert [rec["acc"] for rec in r["records"]] == [float(g) for _, g in expected]
    lls = [rec["lls"][0] for rec in r["records"]]  # (equal to the direct ones above within float rounding,
    # which exp() of a mean near -30 would magnify past any tight tolerance)
    assert r["metrics"]["perplexity"]["value"] == pytest.approx(math.exp(-sum(lls) / len(lls)), rel=1e-9)
    assert r["metrics"]["perplexity"]["stderr"] > 0
    assert r["items"] == 4 and r["failed"] == 0 and r["kind"] == "loglikelihood"


def test_multiple_choice_task_end_to_end():
    tok = small_tokenizer()
    model = tiny_model(4, init_std=0.2)
    task = get_task("winogrande")  # two contexts, one continuation: a shared prefix, not a shared context
    r = evaluate_task(model, tok, task, EvalSettings(limit=5, batch_size=3), progress=False)
    for item, rec in zip(task.items(limit=5), r["records"]):
        encoded = encode_requests(tok, item.requests(), model.cfg.max_seq_len)
        lls = [direct(model, e)[0] for e in encoded]
        assert rec["lls"] == pytest.approx(lls, abs=1e-4)
        assert rec["acc"] == float(max(range(2), key=lambda k: lls[k]) == item.gold)
    accs = [rec["acc"] for rec in r["records"]]
    assert r["metrics"]["acc"]["value"] == pytest.approx(sum(accs) / 5)
    assert r["metrics"]["acc"]["stderr"] == pytest.approx(mean_stderr(accs))
    assert r["data_hash"] == task.data_hash and r["num_fewshot"] == 0


def test_passes_split_rows_at_least_cost_within_the_limits():
    """The row split is the cheapest one (brute force over every split of 8 rows) that keeps each
    pass within its row and padded-position limits."""
    import itertools

    from groundup.eval.scoring import _passes

    lengths = [40, 38, 20, 19, 18, 6, 5, 1]
    for pass_cost, budget, max_rows in ((10, 1000, 8), (48, 80, 3), (0, 1000, 8), (500, 1000, 8)):
        def ok(s, e):
            return e - s <= max_rows and ((e - s) * lengths[s] <= budget or e - s == 1)

        best = float("inf")
        for cuts in itertools.product([0, 1], repeat=len(lengths) - 1):
            bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [len(lengths)]
            spans = list(zip(bounds, bounds[1:]))
            if all(ok(s, e) for s, e in spans):
                best = min(best, sum(pass_cost + (e - s) * lengths[s] for s, e in spans))
        got = _passes(lengths, budget, max_rows, pass_cost)
        assert [s for s, _ in got][0] == 0 and got[-1][1] == len(lengths)
        assert all(a[1] == b[0] for a, b in zip(got, got[1:])) and all(ok(s, e) for s, e in got)
        assert sum(pass_cost + (e - s) * lengths[s] for s, e in got) == best
    assert _passes(lengths, 1000, 8, 0) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8)]
    assert _passes(lengths, 1000, 8, 10_000) == [(0, 8)]
