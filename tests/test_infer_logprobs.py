"""The engine's log-probabilities of sampled tokens agree with the shared scorer, and it leaves the
model's train/eval mode as it found it (GRPO samples from the policy it is training)."""

from __future__ import annotations

import pytest
import torch

from conftest import VARIANTS
from groundup.infer import Generator
from groundup.model.logprobs import logprobs
from infer_helpers import small_tokenizer, tiny_model


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


@pytest.mark.parametrize("variant", ["gqa", "mla", "moe"])
@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_sampled_token_logprobs_equal_the_scorer_on_the_whole_sequence(tok, variant, temperature):
    model = tiny_model(**VARIANTS[variant])
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)  # a peaked distribution: a wrong position would show
    gen = Generator(model, tok)
    prompts = [[tok.eot_id] + tok.encode(t) for t in ("To be, or not", "Hello there my good lord")]
    out = gen.complete_ids(prompts, max_new_tokens=12, temperature=temperature, seed=3, logprobs=True,
                           top_logprobs=3)
    for prompt, c in zip(prompts, out):
        assert len(c.logprobs) == len(c.token_ids) == len(c.top_logprobs) > 0
        seq = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            ref = logprobs(model, seq[:, :-1], seq[:, 1:])[0, len(prompt) - 1:]
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
        for lp, top in zip(c.logprobs, c.top_logprobs):
            assert len(top) == 3 and top[0][1] >= top[1][1] >= top[2][1] and lp <= top[0][1] + 1e-6
        if temperature == 0:  # greedy: the chosen token is the likeliest
            assert [top[0][0] for top in c.top_logprobs] == c.token_ids


def test_generation_restores_the_mode_it_found(tok):
    model = tiny_model(dropout=0.5).train()
    gen = Generator(model, tok)
    a = gen.generate(["To be"], max_new_tokens=8, temperature=0)
    assert model.training
    b = gen.generate(["To be"], max_new_tokens=8, temperature=0)
    assert a == b  # no dropout while generating, although the model trains with it
    model.eval()
    gen.generate(["To be"], max_new_tokens=4, temperature=0)
    assert not model.training
