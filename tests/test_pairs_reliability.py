"""`groundup data pairs` with nothing to sample, nothing usable, or nowhere to write (issue 28): a clear
error before any work, and never an output (or an unfinished run) that blocks the next attempt."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from groundup.errors import ConfigError, DataError
from infer_helpers import model_dir, small_tokenizer, tiny_model

REWARDS = '''
calls = []
def has_e(prompt, completion, **fields):
    calls.append(completion)
    return float("e" in completion)
def constant(prompt, completion, **fields):
    calls.append(completion)
    return 0.0
def raises(prompt, completion, **fields):
    calls.append(completion)
    raise RuntimeError("no grader here")
'''


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    model_dir(root / "base", tiny_model(max_seq_len=64), small_tokenizer())
    rows = [{"messages": [{"role": "user", "content": f"Tell me about {w}."}]}
            for w in ("kings", "queens", "ships", "stars", "bread", "wine", "roses", "swords")]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "bad.jsonl").write_text('{"text": "no prompt here"}\n{"messages": []}\n')
    (root / "pr_rewards.py").write_text(REWARDS)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("pr_rewards", None)


@pytest.fixture
def calls(root):
    import pr_rewards

    pr_rewards.calls.clear()
    return pr_rewards.calls


def pairs_run(root, out, *extra, reward="pr_rewards:has_e", prompts="prompts.jsonl"):
    from groundup.posttrain.data_commands import pairs, pairs_arguments

    parser = argparse.ArgumentParser()
    pairs_arguments(parser)
    return pairs(parser.parse_args(["--model", str(root / "base"), "--prompts", str(root / prompts), "--reward",
                                    reward, "--out", str(out), "--samples", "2", "--max-new-tokens", "6",
                                    "--batch-size", "4", "--device", "cpu", "--no-progress", *extra]))


def leftovers(folder) -> list[str]:
    return sorted(f.name for f in folder.iterdir())


@pytest.mark.parametrize("flag, value, expected", [("--limit", "-1", "--limit -1: expected at least 1"),
                                                   ("--limit", "0", "--limit 0: expected at least 1"),
                                                   ("--reward-patience", "-2", "--reward-patience -2: expected an "
                                                                               "integer >= 0")])
def test_out_of_range_values_are_refused_before_any_work(root, tmp_path, calls, flag, value, expected):
    with pytest.raises(ConfigError, match=expected):
        pairs_run(root, tmp_path / "p.jsonl", flag, value)
    assert leftovers(tmp_path) == [] and calls == []


def test_no_usable_prompt_writes_nothing_and_does_not_block_the_next_run(root, tmp_path, calls):
    with pytest.raises(DataError, match=r"no usable prompt in .*bad\.jsonl.*2 records skipped: .*bad\.jsonl:1: "
                                        r"expected 'prompt'"):
        pairs_run(root, tmp_path / "p.jsonl", prompts="bad.jsonl")
    assert leftovers(tmp_path) == [] and calls == []
    assert pairs_run(root, tmp_path / "p.jsonl") == 0  # the same --out, now with good prompts
    assert leftovers(tmp_path) == ["p.jsonl"]


def test_max_new_tokens_at_the_context_is_refused(root, tmp_path, calls):
    with pytest.raises(ConfigError, match=r"--max-new-tokens 64: at or over the model's context \(64 tokens\)"):
        pairs_run(root, tmp_path / "p.jsonl", "--max-new-tokens", "64")
    assert leftovers(tmp_path) == [] and calls == []


def test_overwrite_onto_a_folder_is_refused_up_front(root, tmp_path, calls):
    (tmp_path / "p.jsonl").mkdir()
    with pytest.raises(DataError, match=r"p\.jsonl is a directory: --out names the pairs file to write"):
        pairs_run(root, tmp_path / "p.jsonl", "--overwrite")
    assert calls == [] and leftovers(tmp_path) == ["p.jsonl"]


@pytest.mark.parametrize("reward, why", [
    ("pr_rewards:constant", r"every one of the 16 samples scored 0"),
    ("pr_rewards:raises", r"the rewards failed on every one of the 16 samples "
                          r"\(e\.g\. 'Tell me about kings\.': pr_rewards:raises: RuntimeError"),
])
def test_no_pair_from_any_prompt_writes_nothing_and_says_why(root, tmp_path, calls, reward, why):
    with pytest.raises(DataError, match=rf"p\.jsonl: nothing written: no pair from 8 prompts: {why}"):
        pairs_run(root, tmp_path / "p.jsonl", "--reward-patience", "0", "--chunk", "2", reward=reward)
    assert leftovers(tmp_path) == [] and len(calls) == 16


def test_a_reward_failing_on_every_call_stops_the_sampling(root, tmp_path, calls):
    with pytest.raises(DataError, match=r"reward 'pr_rewards:raises' failed on every call of the last 2 batches "
                                        r"\(RuntimeError: no grader here\).*--reward-patience"):
        pairs_run(root, tmp_path / "p.jsonl", "--reward-patience", "2", "--chunk", "2", reward="pr_rewards:raises")
    assert len(calls) == 8  # two batches of 4 completions, not the 16 of all 8 prompts
    assert leftovers(tmp_path) == []  # nothing to resume: its chunks were scored by a reward that never worked


def test_rewards_that_never_vary_stop_the_sampling(root, tmp_path, calls):
    with pytest.raises(DataError, match=r"every prompt's completions scored alike in the first 2 batches "
                                        r"\(mean reward 0\)"):
        pairs_run(root, tmp_path / "p.jsonl", "--reward-patience", "2", reward="pr_rewards:constant")
    assert len(calls) == 8 and leftovers(tmp_path) == []
