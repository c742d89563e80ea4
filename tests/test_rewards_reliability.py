"""Rewards that silently never work (issue 28): the code reward's interpreter, a prompt record with a
`completion` field, a reward that calls sys.exit, GRPO and RFT runs whose rewards all fail or never
vary, RFT keeping samples that scored nothing, an RFT rerun with other settings, a misnamed key."""

from __future__ import annotations

import json
import sys

import pytest

from groundup.config import load_config
from groundup.errors import ConfigError, DataError
from groundup.posttrain.config import GRPOConfig, RFTConfig
from groundup.posttrain.grpo import grpo
from groundup.posttrain.rft import rft
from groundup.posttrain.rollout import read_prompts
from groundup.rewards.functions import code, load_rewards, score
from infer_helpers import model_dir, small_tokenizer, tiny_model
from train_helpers import metrics

REWARDS = '''
import sys
calls = []
def constant(prompt, completion, **fields):
    return 1.0
def zero(prompt, completion, **fields):
    return 0.0
def raises(prompt, completion, **fields):
    raise RuntimeError("no grader here")
def quits(prompt, completion, **fields):
    sys.exit(3)
def half(prompt, completion, **fields):
    calls.append(completion)
    if len(calls) % 2:
        raise ValueError("odd call")
    return 1.0 + float("e" in completion)
'''


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("rewards")
    model_dir(root / "base", tiny_model(max_seq_len=128), small_tokenizer())
    model_dir(root / "other", tiny_model(seed=1, max_seq_len=128), small_tokenizer())
    rows = [{"messages": [{"role": "user", "content": f"Tell me about {w}."}], "answer": "1"}
            for w in ("kings", "queens", "ships", "stars", "bread", "wine")]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "more.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    (root / "rr_rewards.py").write_text(REWARDS)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("rr_rewards", None)


def test_code_reward_runs_the_tests_with_the_sandbox_interpreter():
    """The sandbox's own interpreter, not sys.executable (which the sandbox user may not be able to run:
    a venv under a 0700 /root, run as root): a right completion passes, a wrong one fails."""
    tests = "def check(f):\n    assert f(2, 3) == 5\n"
    assert code("def add(a, b):\n", "    return a + b\n", tests=tests, entry_point="add") == 1.0
    assert code("def add(a, b):\n", "    return a - b\n", tests=tests, entry_point="add") == 0.0
    total, _, error = score(load_rewards(["code"]), "def add(a, b):\n", "    return a + b\n",
                            {"tests": tests, "entry_point": "add"})
    assert (total, error) == (1.0, None)


def test_a_prompt_completion_record_is_scored_like_any_prompt(tmp_path):
    """TRL's prompt-completion files carry a `completion` (the reference): it must not collide with the
    sampled completion every reward is called with."""
    (tmp_path / "pc.jsonl").write_text(json.dumps({"prompt": "What is 2 + 2?", "completion": "Answer: 4",
                                                   "answer": "4"}) + "\n")
    prompts, _, bad = read_prompts([tmp_path / "pc.jsonl"], small_tokenizer(), 100)
    assert len(prompts) == 1 and not bad
    p = prompts[0]
    seen = []
    rewards = load_rewards(["exact_match", "format_answer"])
    rewards.append(type(rewards[0])("mine", lambda prompt, completion, **fields: seen.append(fields) or 0.5))
    total, parts, error = score(rewards, p.text, "Answer: 5", p.fields, p.messages)
    assert error is None and parts == {"exact_match": 0.0, "format_answer": 1.0, "mine": 0.5} and total == 1.5
    assert seen == [{"answer": "4"}]


def test_a_reward_that_calls_sys_exit_fails_that_call_not_the_run(root):
    total, parts, error = score(load_rewards(["rr_rewards:quits", "format_answer"]), "q", "Answer: 1", {})
    assert total == 1.0 and parts["rr_rewards:quits"] == 0.0
    assert error.startswith("rr_rewards:quits: ") and "sys.exit(3)" in error


def test_a_negative_temperature_is_named_as_such():
    with pytest.raises(ConfigError, match=r"^grpo\.temperature = -1\.0") as e:
        load_config(GRPOConfig, None, ["grpo.temperature=-1"])
    assert "beta" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^grpo\.top_p = 0\.0"):
        load_config(GRPOConfig, None, ["grpo.top_p=0"])
    for section, cls in (("grpo", GRPOConfig), ("rft", RFTConfig)):
        with pytest.raises(ConfigError, match=rf"^{section}\.reward_patience = -1: expected an integer >= 0"):
            load_config(cls, None, [f"{section}.reward_patience=-1"])


def grpo_cfg(root, reward, *extra):
    return load_config(GRPOConfig, None, [
        f"base={json.dumps(str(root / 'base'))}", f"grpo.prompts={json.dumps([str(root / 'prompts.jsonl')])}",
        f'grpo.rewards=["{reward}"]', "grpo.group_size=2", "grpo.prompts_per_batch=2", "grpo.max_new_tokens=6",
        "grpo.eval_count=0", "grpo.max_resample=1", "train.threads=2", "log.every=1", "log.progress=false",
        "eval.every=0", "eval.at_end=false", "checkpoint.every=100", *extra])


@pytest.mark.parametrize("reward, why", [
    ("rr_rewards:raises", r"reward 'rr_rewards:raises' failed on every call of the last 3 steps "
                          r"\(RuntimeError: no grader here\)"),
    ("rr_rewards:quits", r"reward 'rr_rewards:quits' failed on every call of the last 3 steps \(.*sys\.exit\(3\)"),
    ("rr_rewards:constant", r"every prompt's completions scored alike in the first 3 steps \(mean reward 1\)"),
])
def test_grpo_whose_rewards_all_fail_or_never_vary_stops_and_says_why(root, tmp_path, reward, why):
    with pytest.raises(DataError, match=why + r".*grpo\.reward_patience"):
        grpo(grpo_cfg(root, reward, "train.max_steps=10", "grpo.reward_patience=3"), tmp_path / "run")
    assert len(metrics(tmp_path / "run")[0]) == 2  # steps 1 and 2 ran; the third step's samples stopped it


def test_grpo_reward_patience_zero_never_stops(root, tmp_path):
    summary = grpo(grpo_cfg(root, "rr_rewards:constant", "train.max_steps=2", "grpo.reward_patience=0"),
                   tmp_path / "run")
    assert summary["steps"] == 2


def rft_cfg(root, reward, *extra):
    return load_config(RFTConfig, None, [
        f"base={json.dumps(str(root / 'base'))}", f"rft.prompts={json.dumps([str(root / 'prompts.jsonl')])}",
        f'rft.rewards=["{reward}"]', "rft.samples=3", "rft.max_new_tokens=6", "rft.eval_count=0",
        "train.seq_len=64", "train.batch_size=2", "train.max_steps=1", "log.progress=false", "eval.at_end=false",
        *extra])


@pytest.mark.parametrize("reward, why", [
    ("rr_rewards:zero", r"every one of the 18 samples scored 0"),
    ("rr_rewards:raises", r"the rewards failed on every one of the 18 samples "
                          r"\(e\.g\. 'Tell me about kings\.': rr_rewards:raises: RuntimeError"),
])
def test_rft_fine_tunes_on_nothing_when_no_sample_earned_its_place(root, tmp_path, capsys, reward, why):
    """No threshold: the best sample of a prompt is kept only when it beats another or scores above 0,
    and a sample whose reward failed is never kept. Nothing kept: no SFT run, no samples file."""
    with pytest.raises(DataError, match=r"round 1: no sample kept.*" + why):
        rft(rft_cfg(root, reward, "rft.reward_patience=0"), tmp_path / "out")
    round_dir = tmp_path / "out" / "round_01"
    assert not (round_dir / "run").exists() and not (round_dir / "samples.jsonl").exists()
    if reward.endswith("raises"):
        assert "reward failure: 'Tell me about kings.': rr_rewards:raises: RuntimeError" in capsys.readouterr().out


def test_rft_stops_sampling_when_a_reward_fails_on_every_call(root, tmp_path):
    with pytest.raises(DataError, match=r"reward 'rr_rewards:raises' failed on every call of the last 1 batches"
                                        r".*rft\.reward_patience"):
        rft(rft_cfg(root, "rr_rewards:raises", "rft.reward_patience=1"), tmp_path / "out")
    assert not list((tmp_path / "out" / "round_01").glob("samples.jsonl*"))  # no unfinished work to resume


def test_rft_keeps_no_failed_sample_and_prints_the_failures(root, tmp_path, capsys):
    import rr_rewards

    rr_rewards.calls.clear()  # `half` fails on every other call: 9 of the 18
    history = rft(rft_cfg(root, "rr_rewards:half"), tmp_path / "out")
    kept = [json.loads(x) for x in (tmp_path / "out" / "round_01" / "samples.jsonl").read_text().splitlines()]
    assert kept and all(k["reward"] >= 1.0 for k in kept)  # a failed call scores 0: never kept
    out = capsys.readouterr().out
    assert "reward failure: " in out and "ValueError: odd call" in out and "9 reward failures" in out
    assert history[0]["reward_errors"] == 9


def test_rft_rerun_with_other_settings_is_refused_unless_overwritten(root, tmp_path):
    cfg = rft_cfg(root, "rr_rewards:half")
    out = tmp_path / "out"
    history = rft(cfg, out)
    assert rft(cfg, out) == history  # the same settings: the finished round is reused
    prompts = f"rft.prompts={json.dumps([str(root / 'more.jsonl')])}"
    for override, key in (('rft.rewards=["format_answer"]', "rft.rewards"), (prompts, "rft.prompts"),
                          (f"base={json.dumps(str(root / 'other'))}", "base"), ("rft.samples=4", "rft.samples")):
        with pytest.raises(DataError, match=rf"{out}: made with other settings \({key}: .* -> .*\).*--overwrite"):
            rft(rft_cfg(root, "rr_rewards:half", override), out)
    assert rft(rft_cfg(root, "rr_rewards:half", "rft.rounds=2"), out)[0] == history[0]  # more rounds: continued
    again = rft(rft_cfg(root, "rr_rewards:half", "rft.samples=4"), out, overwrite=True)
    assert again[0]["samples"] == 24 and len(again) == 1 and not (out / "round_02").exists()
    assert rft(rft_cfg(root, "rr_rewards:half", "rft.samples=4"), out) == again


def test_which_samples_rft_keeps():
    from groundup.posttrain.sampled_data import kept_samples

    no, yes = False, True
    assert kept_samples([0.0, 0.0, 0.0], [no, no, no], None) == []  # all wrong: nothing to imitate
    assert kept_samples([1.0, 1.0], [no, no], None) == [0]  # all right: the first
    assert kept_samples([-2.0, -1.0, -1.0], [no, no, no], None) == [1]  # a reward model's scale: the best
    assert kept_samples([5.0, 0.0], [yes, no], None) == []  # the 5 is another reward's: one of them failed
    assert kept_samples([0.0, 2.0, 3.0], [no, no, yes], 1.0) == [1]  # a failed sample is never kept
