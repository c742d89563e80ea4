"""GRPO: the loss on a fixed batch equals a direct implementation of the formula; advantages; a run
on the training core with rewards that fail, exact resume mid-iterations; the shipped rewards."""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import pytest
import torch

from groundup.config import load_config
from groundup.errors import ConfigError
from groundup.posttrain.config import GRPOConfig
from groundup.posttrain.grpo import aggregate, grpo, grpo_token_loss
from groundup.rewards.functions import exact_match, exact_match_lenient, format_answer, load_rewards, score
from infer_helpers import model_dir, small_tokenizer, tiny_model
from train_helpers import assert_resumes_exactly, metrics


def _direct(logp, old, adv, ref, mask, eps, eps_high, beta, how, max_new):
    """The formula, one token at a time."""
    per_seq, total, count = [], 0.0, 0
    for i in range(len(logp)):
        terms = []
        for t in range(len(logp[0])):
            if not mask[i][t]:
                continue
            ratio = math.exp(logp[i][t] - old[i][t])
            a = adv[i]
            obj = min(ratio * a, min(max(ratio, 1 - eps), 1 + eps_high) * a)
            d = ref[i][t] - logp[i][t]
            terms.append(-obj + beta * (math.exp(d) - d - 1))
        per_seq.append(sum(terms) / max(1, len(terms)))
        total, count = total + sum(terms), count + len(terms)
    return {"sequence": sum(per_seq) / len(per_seq), "token": total / count,
            "dr_grpo": total / (len(logp) * max_new)}[how]


@pytest.mark.parametrize("how", ["sequence", "token", "dr_grpo"])
def test_loss_equals_the_formula(how):
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 6, generator=g) * 3
    old = logp + torch.randn(4, 6, generator=g) * 0.3  # ratios well outside the clip range too
    ref = logp + torch.randn(4, 6, generator=g) * 0.2
    adv = torch.tensor([1.2, -0.7, 0.3, -1.5])
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    per, kl, clipped = grpo_token_loss(logp, old, adv, ref, 0.2, 0.28, 0.05)
    ours = float(aggregate(per, mask, how, max_new_tokens=8))
    assert ours == pytest.approx(_direct(logp.tolist(), old.tolist(), adv.tolist(), ref.tolist(), mask.tolist(),
                                         0.2, 1.28, 0.05, how, 8), rel=1e-6)
    assert 0 < float((clipped * mask).sum()) < float(mask.sum())


def test_shipped_rewards_and_failures():
    assert exact_match("q", "12 + 5 = 17.\nAnswer: 17", answer="17") == 1.0
    assert exact_match("q", "it is 17", answer="17") == 0.0 and exact_match_lenient("q", "it is 17", answer=17) == 1.0
    assert format_answer("q", "Answer: 3") == 1.0 and format_answer("q", "three") == 0.0
    rewards = load_rewards(["exact_match", "format_answer", "reward_helpers:broken"], [1.0, 0.5, 2.0])
    total, parts, error = score(rewards, "q", "Answer: 4", {"answer": "4"})
    assert total == 1.5 and parts["reward_helpers:broken"] == 0.0 and "ZeroDivisionError" in error
    with pytest.raises(ConfigError, match="did you mean 'exact_match'"):
        load_rewards(["exact_macth"])
    with pytest.raises(ConfigError, match="cannot import"):
        load_rewards(["no_such_module:f"])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    model_dir(root / "base", tiny_model(max_seq_len=128), small_tokenizer())
    rows = [{"messages": [{"role": "user", "content": f"Say something about {w}."}], "answer": "1"}
            for w in ("kings", "queens", "the sea", "the moon", "bread", "wine", "swords", "roses")]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = [{**r, "split": "heldout"} for r in rows[:3]] + rows[3:4]  # as `data sample --chat` marks them, or not
    (root / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    return root


def _cfg(root, *extra):
    return load_config(GRPOConfig, None, [
        f"base={json.dumps(str(root / 'base'))}", f"grpo.prompts={json.dumps([str(root / 'prompts.jsonl')])}",
        'grpo.rewards=["reward_helpers:has_e", "reward_helpers:flaky"]', "grpo.group_size=4",
        "grpo.prompts_per_batch=2", "grpo.max_new_tokens=8", "grpo.eval_count=0",
        "train.threads=2", "log.every=1", "log.progress=false", "eval.every=0", "eval.at_end=false",
        "checkpoint.every=2", "schedule.peak_lr=1e-3", *extra])


def test_grpo_runs_logs_and_resumes_exactly(setup, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(setup.parent))
    extra = ["train.max_steps=4", "train.grad_accum=2", "grpo.iterations=2", "grpo.beta=0.04"]
    summary = grpo(_cfg(setup, *extra), tmp_path / "run")
    steps, events = metrics(tmp_path / "run")
    assert summary["steps"] == 4 and summary["reward_errors"] > 0  # the flaky reward failed, the run went on
    for key in ("reward", "reward_std", "reward/reward_helpers:has_e", "kl", "clip_fraction", "entropy",
                "completion_length", "truncated", "uninformative_groups"):
        assert key in steps[0], key
    assert steps[0]["kl"] == pytest.approx(0, abs=1e-5)  # the policy starts as the reference
    assert_resumes_exactly(tmp_path / "run", lambda run: grpo(_cfg(setup, *extra), run, resume=True), 4)


def test_grpo_with_lora_uses_the_base_as_reference(setup, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(setup.parent))
    summary = grpo(_cfg(setup, "train.max_steps=2", "lora.rank=4", "grpo.beta=0.1", "grpo.loss_aggregation=token",
                        "grpo.scale_rewards=false", f"grpo.eval_prompts={json.dumps([str(setup / 'heldout.jsonl')])}"),
                   tmp_path / "run")
    assert summary["steps"] == 2
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["heldout"] == 4  # every record of an eval file is held out
    assert (tmp_path / "run" / "checkpoints" / "step_0000002" / "adapter_model.safetensors").is_file()


def test_log_probabilities_are_those_of_the_sampling_temperature(setup):
    """TRL divides the logits by the sampling temperature for the policy, old and reference
    log-probabilities alike: sampled at T 0.7, the old and reference log-probs of a batch are
    log_softmax(logits / 0.7) of a plain forward, so the first pass's ratio is 1 and its KL 0."""
    import copy

    from groundup.posttrain.config import GRPOSection
    from groundup.posttrain.grpo import GRPOObjective
    from groundup.posttrain.rollout import RolloutLoader, read_prompts

    tok, model = small_tokenizer(), tiny_model(max_seq_len=128, init_std=0.2)
    prompts, _, _ = read_prompts([setup / "prompts.jsonl"], tok, 120)
    section = GRPOSection(group_size=4, prompts_per_batch=2, max_new_tokens=8, temperature=0.7, beta=0.04,
                          rewards=["reward_helpers:has_e"])
    loader = RolloutLoader(prompts, section, load_rewards(section.rewards), tok)
    loader.bind(model, copy.deepcopy(model))
    batch = next(loader)
    valid = batch.targets != -100
    with torch.no_grad():
        logits = model(batch.inputs).logits
    gather = lambda lp: lp.gather(-1, batch.targets.clamp_min(0)[..., None]).squeeze(-1)[valid]  # noqa: E731
    tempered = gather(torch.log_softmax(logits / 0.7, dim=-1))
    assert torch.allclose(batch.old_logps[valid], tempered, atol=1e-4)
    assert torch.allclose(batch.ref_logps[valid], tempered, atol=1e-4)
    assert (gather(torch.log_softmax(logits, dim=-1)) - tempered).abs().max() > 0.05  # T 1 would differ
    out = GRPOObjective(section, rewards=load_rewards(section.rewards), tokenizer=tok)(model, batch, "cpu")
    assert float(out.metrics["clip_fraction"]) == 0 and float(out.metrics["kl"]) == pytest.approx(0, abs=1e-6)


def test_truncated_completions_count_in_advantages_but_are_not_trained(setup):
    """grpo.mask_truncated (TRL's mask_truncated_completions): the same samples and advantages, but a
    reply cut off at max_new_tokens has no target left, and a batch of only such replies trains nothing."""
    from groundup.posttrain.config import GRPOSection
    from groundup.posttrain.grpo import GRPOObjective
    from groundup.posttrain.rollout import RolloutLoader, read_prompts

    tok, model = small_tokenizer(), tiny_model(max_seq_len=128, init_std=1.0)
    prompts, _, _ = read_prompts([setup / "prompts.jsonl"], tok, 120)
    batches = {}
    for mask in (False, True):
        section = GRPOSection(group_size=4, prompts_per_batch=8, max_new_tokens=24, temperature=1.0,
                              loss_aggregation="token", rewards=["reward_helpers:has_e"], mask_truncated=mask)
        loader = RolloutLoader(prompts, section, load_rewards(section.rewards), tok)
        loader.bind(model)
        batches[mask] = (section, next(loader))
    plain, masked = batches[False][1], batches[True][1]
    assert 0 < plain.stats["truncated"] < 1  # 24 tokens of a random model: some replies end their turn, not all
    assert torch.equal(plain.inputs, masked.inputs) and torch.equal(plain.advantages, masked.advantages)
    dropped = (masked.targets == -100).all(dim=1)
    assert 0 < dropped.sum() < len(dropped)
    assert ((plain.targets[dropped] != -100).sum(dim=1) == 24).all()  # cut off at max_new_tokens
    assert torch.equal(plain.targets[~dropped], masked.targets[~dropped])  # replies that ended keep their targets
    section = batches[True][0]
    objective = GRPOObjective(section, rewards=load_rewards(section.rewards), tokenizer=tok)
    kept = dataclasses.replace(plain, **{k: getattr(plain, k)[~dropped] for k in
                                         ("inputs", "targets", "old_logps", "advantages")})
    loss = {k: objective(model, b, "cpu").loss.item() for k, b in (("masked", masked), ("kept", kept))}
    assert loss["masked"] == pytest.approx(loss["kept"], abs=1e-6)  # per token: the cut-off replies add nothing
    none_left = dataclasses.replace(masked, targets=torch.full_like(masked.targets, -100))
    out = objective(model, none_left, "cpu")
    grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
    assert out.loss.item() == 0 and all(g is None or not g.any() for g in grads)


@pytest.fixture(autouse=True, scope="module")
def _reward_module(tmp_path_factory):
    """A user's reward module on the path: one real reward, one that fails now and then."""
    root = tmp_path_factory.getbasetemp()
    (root / "reward_helpers.py").write_text(
        "import itertools\n_n = itertools.count()\n"
        "def has_e(prompt, completion, **fields):\n    return float('e' in completion)\n"
        "def flaky(prompt, completion, **fields):\n    if next(_n) % 5 == 0:\n        raise RuntimeError('flaky')\n"
        "    return float('nan') if len(completion) % 7 == 0 else 0.0\n"
        "def broken(prompt, completion, **fields):\n    return 1 / 0\n")
    sys.path.insert(0, str(root))
    yield
    sys.path.remove(str(root))
