"""Speculative decoding: prompt lookup and a draft model give greedy outputs identical to plain decoding, and
sampled outputs that follow the target's distribution (the rejection rule, tested statistically on its own
and through the engine)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from groundup.errors import ConfigError
from groundup.infer import Generator
from groundup.infer.core import EngineCore, Request
from groundup.infer.sampling import SamplingConfig, filtered_probs
from groundup.infer.speculative import SpeculativeConfig, Speculator, accept, ngram_proposal
from infer_helpers import small_tokenizer, tiny_model

stats = pytest.importorskip("scipy.stats")

PROMPTS = ["To be, or not to be, that is the question. To be, or not", "KING HENRY. Now, lords, for France!",
           "the the the the the the the"]


@pytest.fixture(scope="module")
def target():
    return tiny_model(max_seq_len=512, init_std=0.2)


def nearby(model, scale: float, seed: int):
    """A draft that agrees with `model` often but not always: its weights plus noise."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return draft


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    assert ngram_proposal([1, 2, 3, 4, 9, 1, 2], k=3, n_min=1, n_max=3) == [3, 4, 9]
    assert ngram_proposal([5, 1, 2, 7, 8, 1, 2, 6, 1, 2], k=2, n_min=1, n_max=2) == [6, 1]  # the latest match
    assert ngram_proposal([7, 3, 1, 2, 3], k=4, n_min=1, n_max=4) == [1, 2, 3]  # "3" alone: n falls to 1
    assert ngram_proposal([1, 2, 3], k=4, n_min=2, n_max=3) == []
    with pytest.raises(ConfigError, match="speculative.num_tokens"):
        Speculator(SpeculativeConfig(num_tokens=0))
    with pytest.raises(ConfigError, match="speculative.method"):
        Speculator(SpeculativeConfig(method="draft"))  # no draft model given


def test_greedy_outputs_equal_plain_decoding(target):
    tok = small_tokenizer()
    plain = Generator(target, tok).complete(PROMPTS, max_new_tokens=60, temperature=0)
    for spec in (Speculator(SpeculativeConfig("ngram", 4)),
                 Speculator(SpeculativeConfig("draft", 3), draft=nearby(target, 0.1, 1))):
        out = Generator(target, tok, speculator=spec).complete(PROMPTS, max_new_tokens=60, temperature=0)
        assert [o.token_ids for o in out] == [p.token_ids for p in plain]
        assert [o.finish_reason for o in out] == [p.finish_reason for p in plain]
        assert spec.proposed > 0 and 0 < spec.accepted < spec.proposed  # partly right: both paths ran
    perfect = Speculator(SpeculativeConfig("draft", 4), draft=target)  # the target as its own draft
    gen = Generator(target, tok, speculator=perfect)
    out = gen.complete([PROMPTS[1]], max_new_tokens=41, temperature=0, stop=[])[0]
    assert out.token_ids == Generator(target, tok).complete([PROMPTS[1]], max_new_tokens=41, temperature=0)[0].token_ids
    assert perfect.acceptance_rate == 1.0 and gen.core.steps == len(out.token_ids[1:]) // 5  # k + 1 per step


def test_a_batch_mixing_speculated_and_plain_rows_decodes_each_as_alone(target):
    """Rows that want log-probs or a penalty decode one token a step in the same forward; n choices too."""
    tok = small_tokenizer()
    ids = [tok.encode(p) for p in PROMPTS]
    configs = [SamplingConfig(max_new_tokens=30, temperature=0, logprobs=True),
               SamplingConfig(max_new_tokens=30, temperature=0, repetition_penalty=1.3),
               SamplingConfig(max_new_tokens=30, temperature=0)]  # "the the the": lookups find proposals

    def run(speculator):
        core = EngineCore(target, tok, max_batch=8, speculator=speculator)
        requests = [Request(p, c, seeds=[0, 1]) for p, c in zip(ids, configs)]
        for r in requests:
            core.add(r)
        out: dict = {}
        while core.has_work():
            for e in core.step():
                if e.token is not None:
                    key = (requests.index(e.request), e.index)
                    out.setdefault(key, []).append((e.token, None if e.logprob is None else round(e.logprob, 4)))
        return out, core

    plain, _ = run(None)
    spec = Speculator(SpeculativeConfig("ngram", 4))
    mixed, core = run(spec)
    assert mixed == plain and spec.proposed > 0
    assert core.pool.used == 0  # every block back, drafts' included


def _fake_sampler(cfg: SamplingConfig, seed: int, vocab: int):
    class S:
        pass

    s = S()
    s.cfg, s.vocab_size = cfg, vocab
    s.generator = torch.Generator().manual_seed(seed)
    return s


@pytest.mark.parametrize("with_draft", [False, True])
def test_the_rejection_rule_keeps_the_targets_distribution(with_draft):
    """Target logits for 3 positions over 6 tokens; drafts from q (or fixed, prompt lookup's one-hot q): the
    first token kept follows p[0] and, when both drafts are kept, the bonus follows p[2] (chi-square)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, generator=g) * 1.5
    cfg = SamplingConfig(temperature=0.9, top_p=0.95)
    p = filtered_probs(logits, cfg)
    q = torch.softmax(torch.randn(2, 6, generator=g), -1)
    sampler = _fake_sampler(cfg, 1, 6)
    first, bonus, trials = torch.zeros(6), torch.zeros(6), 20_000
    for _ in range(trials):
        if with_draft:
            drafts = [int(torch.multinomial(q[j], 1, generator=g)) for j in range(2)]
            kept, n = accept(drafts, q, logits, sampler)
        else:
            drafts = [int(p[0].argmax()), int(p[1].argmax())]  # a lookup's guess: kept often, not always
            kept, n = accept(drafts, None, logits, sampler)
        first[kept[0]] += 1
        if n == 2:
            bonus[kept[2]] += 1
    assert 1000 < bonus.sum() < trials - 1000
    for counts, probs in ((first, p[0]), (bonus, p[2])):
        keep = probs > 0
        assert counts[~keep].sum() == 0  # top-p's excluded tokens never appear
        expected = probs[keep] / probs[keep].sum() * counts.sum()
        assert stats.chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 1e-3


def test_sampled_engine_outputs_follow_the_target(target):
    """The first three sampled tokens of 1,000 choices (parts of 64: more than a batch holds) with and without a (different) draft model: the same
    distribution (chi-square test of homogeneity on the token pairs each position produced)."""
    tok = small_tokenizer()
    prompt = tok.encode("KING HENRY.")
    cfg = SamplingConfig(max_new_tokens=3, temperature=0.7, stop=[])
    draft = nearby(target, 0.15, 3)

    def tokens(speculator, seed):
        core = EngineCore(target, tok, max_batch=64, speculator=speculator)
        core.add(Request(prompt, cfg, seeds=list(range(seed, seed + 1000)), stop_ids=frozenset()))
        out: dict[int, list[int]] = {}
        while core.has_work():
            for e in core.step():
                if e.token is not None:
                    out.setdefault(e.index, []).append(e.token)
        assert len(out) == 1000 and {len(v) for v in out.values()} == {3}
        return [tuple(v) for v in out.values()]

    spec = Speculator(SpeculativeConfig("draft", 2), draft=draft)
    a, b = tokens(None, 0), tokens(spec, 10_000)
    assert spec.proposed > 0 and 0.05 < spec.acceptance_rate < 0.95
    for position in (1, 2):
        keys = sorted({t[position] for t in a + b})
        table = [[sum(t[position] == k for t in a) for k in keys], [sum(t[position] == k for t in b) for k in keys]]
        common = [i for i in range(len(keys)) if table[0][i] + table[1][i] >= 10]  # chi-square needs counts
        rest = [sum(row) - sum(row[i] for i in common) for row in table]
        observed = [[row[i] for i in common] + [r] for row, r in zip(table, rest)]
        assert stats.chi2_contingency(observed).pvalue > 1e-3


def test_generate_flags_load_a_draft_and_refuse_one_over_another_tokenizer(target, tmp_path, capsys):
    """`generate --speculative-method draft --draft-model DIR` prints plain greedy decoding's text; a draft
    trained on another tokenizer, or a draft without the method, is refused with the flag's name."""
    from groundup.cli import main
    from groundup.tokenizer import TokenizerConfig, train_tokenizer
    from infer_helpers import model_dir

    tok = small_tokenizer()
    target_dir = model_dir(tmp_path / "target", target, tok)
    draft_dir = model_dir(tmp_path / "draft", nearby(target, 0.1, 1), tok)
    args = ["generate", "--model", str(target_dir), "--prompt", "KING HENRY.", "--max-new-tokens", "24",
            "--temperature", "0", "--json"]
    outputs = []
    for extra in ([], ["--speculative-method", "draft", "--draft-model", str(draft_dir)],
                  ["--speculative-method", "ngram", "--num-speculative-tokens", "3"]):
        assert main(args + extra) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2] and '"completion"' in outputs[0]
    other = train_tokenizer(["a b c d e f g " * 50], TokenizerConfig(vocab_size=300), progress=False)
    model_dir(tmp_path / "other", tiny_model(), other)
    assert main(args + ["--speculative-method", "draft", "--draft-model", str(tmp_path / "other")]) != 0
    err = capsys.readouterr().err
    assert "--draft-model" in err and "a draft must be trained on the same tokenizer" in err
    assert main(args + ["--draft-model", str(draft_dir)]) != 0
    assert "--draft-model needs --speculative-method draft" in capsys.readouterr().err


def test_the_server_with_prompt_lookup_answers_as_without_and_counts_its_drafts(target):
    """/v1/completions through a server with `--speculative-method ngram`: the same greedy text as a plain
    server, streamed or not, and the drafts it proposed and kept in /metrics."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from groundup.serve.app import create_app
    from groundup.serve.server import Limits, Server
    from serve_helpers import scrape

    body = {"model": "tiny", "prompt": "the the the the the the the", "max_tokens": 24, "temperature": 0}
    texts = []
    for spec in (None, Speculator(SpeculativeConfig("ngram", 3))):
        server = Server(target, small_tokenizer(), name="tiny", limits=Limits(max_batch=4), speculator=spec)
        with TestClient(create_app(server)) as c:
            texts.append(c.post("/v1/completions", json=body).json()["choices"][0]["text"])
            streamed = c.post("/v1/completions", json=body | {"stream": True}).text
            metrics = scrape(c.get("/metrics").text)
        assert "".join(json.loads(line[6:])["choices"][0]["text"] for line in streamed.splitlines()
                       if line.startswith("data: {")) == texts[-1]
    assert texts[0] == texts[1]
    assert spec.proposed > 0 and metrics["vllm:spec_decode_num_draft_tokens_total"] == spec.proposed
    assert metrics["vllm:spec_decode_num_accepted_tokens_total"] == spec.accepted
    assert 0 < metrics["vllm:spec_decode_num_drafts_total"] <= spec.proposed
