"""The reward model (Bradley-Terry), best-of-n sampling with it, pairs from a model's own samples, and
rejection-sampling fine-tuning in rounds."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
import torch.nn.functional as F

from groundup.config import load_config
from groundup.errors import DataError
from groundup.model.heads import RewardScore
from groundup.posttrain.config import RFTConfig, RMConfig
from groundup.posttrain.pairs import read_pairs
from groundup.posttrain.reward_model import RewardObjective, rm
from groundup.rewards.model_scorer import RewardModelScorer
from groundup.posttrain.rft import rft
from infer_helpers import model_dir, small_tokenizer, tiny_model
from train_helpers import assert_resumes_exactly, assert_same_steps, metrics, run_cli


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    model_dir(root / "base", tiny_model(max_seq_len=128), small_tokenizer())
    rows = [{"prompt": [{"role": "user", "content": f"Is {i + 3} more than {i}?"}],
             "chosen": [{"role": "assistant", "content": "yes indeed"}],
             "rejected": [{"role": "assistant", "content": "no never"}]} for i in range(60)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = [{"messages": [{"role": "user", "content": f"Tell me about {w}."}]}
               for w in ("kings", "queens", "ships", "stars", "bread", "wine")]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    (root / "reward_mod.py").write_text("def has_e(prompt, completion, **fields):\n"
                                        "    return float(completion.count('e'))\n")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def four_pairs(root):
    """(an untrained reward model, its batch of the first four pairs, those pairs)."""
    from groundup.posttrain.preference import make_batch

    pairs, _ = read_pairs([root / "pairs.jsonl"], small_tokenizer(), 64)
    torch.manual_seed(0)
    return tiny_model(value_head=True), make_batch(pairs[:4], "rm", 0, pairs), pairs[:4]


def test_bradley_terry_loss_is_the_closed_form(root):
    model, batch, pairs = four_pairs(root)
    out = RewardObjective([], 0)(model, batch, "cpu")
    rewards = []
    for p in pairs:
        for completion in (p.chosen, p.rejected):
            ids = torch.tensor([p.prompt + completion])
            rewards.append(model(ids, head=RewardScore(torch.tensor([ids.shape[1] - 1]))).rewards[0])
    chosen, rejected = torch.stack(rewards[0::2]), torch.stack(rewards[1::2])
    assert float(out.loss) == pytest.approx(float(-F.logsigmoid(chosen - rejected).mean()), rel=1e-5)


def test_language_modelling_term_is_the_chosen_completions_nll(root):
    model, batch, pairs = four_pairs(root)
    plain, weighted = RewardObjective([], 0)(model, batch, "cpu"), RewardObjective([], 0, 0.5)(model, batch, "cpu")
    nll, count = 0.0, 0
    for p in pairs:  # the reply's tokens predicted from the prompt and the reply so far (the prompt is not)
        ids = torch.tensor([p.prompt + p.chosen])
        logits = model(ids).logits[0, len(p.prompt) - 1 : -1]
        nll += float(F.cross_entropy(logits.float(), ids[0, len(p.prompt):], reduction="sum"))
        count += len(p.chosen)
    assert float(weighted.metrics["chosen_nll"]) == pytest.approx(nll / count, rel=1e-5)
    assert float(weighted.loss) == pytest.approx(float(plain.loss) + 0.5 * nll / count, rel=1e-5)
    assert nll / count > 1.0  # an untrained model: the term is large enough to matter in the sum


def test_pair_ranking_benchmark_counts_what_each_model_prefers(root):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from pair_ranking import rank_pairs

    tok = small_tokenizer()
    pairs, _ = read_pairs([root / "pairs.jsonl"], tok, 64)
    for p in pairs[::3]:  # a third of the pairs the other way round: whatever a model prefers, it is right
        p.chosen, p.rejected = p.rejected, p.chosen  # on a third or on two thirds, never on all or none
    torch.manual_seed(1)
    lm, rm_model = tiny_model(), tiny_model(value_head=True)
    right_lm = right_rm = 0
    for p in pairs:  # the direct reading: one conversation at a time
        scores = []
        for completion in (p.chosen, p.rejected):
            ids = torch.tensor([p.prompt + completion])
            logits = lm(ids).logits[0, len(p.prompt) - 1 : -1].float()
            scores.append(-float(F.cross_entropy(logits, ids[0, len(p.prompt):], reduction="sum")))
            scores.append(float(rm_model(ids, head=RewardScore(torch.tensor([ids.shape[1] - 1]))).rewards[0]))
        right_lm += scores[0] > scores[2]
        right_rm += scores[1] > scores[3]
    lm_result, rm_result = rank_pairs(lm, tok, pairs, batch_size=7), rank_pairs(rm_model, tok, pairs, batch_size=7)
    assert lm_result["accuracy_sum"] == right_lm / len(pairs) and rm_result["accuracy"] == right_rm / len(pairs)
    assert {right_lm, right_rm} <= {20, 40}


def test_reward_model_learns_the_preference_resumes_exactly_and_ranks_samples(root, tmp_path):
    cfg = load_config(RMConfig, None, [f"base={json.dumps(str(root / 'base'))}",
                                       f"rm.data={json.dumps([str(root / 'pairs.jsonl')])}", "rm.val_fraction=0.2",
                                       "train.seq_len=64", "train.batch_size=8", "train.max_steps=12",
                                       "schedule.peak_lr=3e-3", "schedule.warmup_steps=0", "log.every=1",
                                       "log.progress=false", "eval.every=0", "checkpoint.every=6"])
    summary = rm(cfg, tmp_path / "rm")
    assert summary["eval"]["val_accuracy"] >= 0.8
    assert_resumes_exactly(tmp_path / "rm", lambda run: rm(cfg, run, resume=True), 12)
    scorer = RewardModelScorer(tmp_path / "rm")
    assert scorer("Is 5 more than 2?", "yes indeed") > scorer("Is 5 more than 2?", "no never")
    # a chat prompt's whole conversation reaches the reward model (through rewards.score), the system
    # message included; a plain reward function still sees only the user's message
    from groundup.rewards.model_scorer import full_rows
    from groundup.rewards.functions import Reward, score

    conversation = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Is 5 more than 2?"}]
    ids, _ = scorer.tok.render_chat(conversation + [{"role": "assistant", "content": "yes indeed"}])
    x, last = full_rows([ids], 0)
    direct = float(scorer.model(x, head=RewardScore(last)).rewards[0])
    seen = []
    total, parts, error = score([Reward("rm", scorer), Reward("plain", lambda prompt, completion, **f: seen.append(f) or 0.0)],
                                "Is 5 more than 2?", "yes indeed", {"answer": "yes"}, conversation)
    assert error is None and parts["rm"] == pytest.approx(direct, abs=1e-6)
    assert parts["rm"] != pytest.approx(scorer("Is 5 more than 2?", "yes indeed"), abs=1e-6)  # the system message counts
    assert seen == [{"answer": "yes"}]
    result = run_cli("generate", "--checkpoint", str(root / "base"), "--prompt", "Is 7 more than 3?", "--best-of", "3",
                     "--reward", f"rm:{tmp_path / 'rm'}", "--max-new-tokens", "4", "--json")
    line = json.loads(result.stdout.splitlines()[0])
    assert line["score"] == max(line["scores"]) and len(line["scores"]) == 3


def test_pairs_from_samples_are_ranked_by_the_reward(root, tmp_path):
    import subprocess

    from train_helpers import env, groundup_cmd

    environment = {**env(), "PYTHONPATH": f"{env()['PYTHONPATH']}:{root}"}  # where the user's reward module is
    subprocess.run(groundup_cmd("data", "pairs", "--model", str(root / "base"), "--prompts", str(root / "prompts.jsonl"),
                                "--reward", "reward_mod:has_e", "--out", str(tmp_path / "p.jsonl"), "--samples", "4",
                                "--max-new-tokens", "12", "--batch-size", "6", "--device", "cpu"), env=environment,
                   check=True, capture_output=True)
    bad = subprocess.run(groundup_cmd("data", "pairs", "--model", str(root / "base"), "--prompts",
                                      str(root / "prompts.jsonl"), "--reward", "reward_mod:has_e", "--out",
                                      str(tmp_path / "q.jsonl"), "--batch-size", "0"), env=environment,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "--batch-size 0: expected at least 1" in bad.stderr
    records = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert records and all(r["chosen_score"] > r["rejected_score"] for r in records)
    assert all(r["chosen"][0]["content"].count("e") == r["chosen_score"] for r in records)
    pairs, report = read_pairs([tmp_path / "p.jsonl"], small_tokenizer(), 128)  # what DPO reads
    assert len(pairs) == len(records) and not report.skipped


def test_pairs_per_prompt_pair_distinct_samples_from_both_ends_of_the_ranking():
    from groundup.posttrain.sampled_data import ranked_pairs

    texts = ["a", "b", "a", "c", "d", "e", "b", "f"]  # "a" and "b" sampled twice
    scores = [1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.0, 0.0]
    assert ranked_pairs(texts, scores) == [(0, 1)]  # the first best against the first worst
    # distinct texts only: a(1) c(1) e(0.5) against b(0) d(0) f(0); the third chosen (e) still scores higher
    assert ranked_pairs(texts, scores, 3) == [(0, 1), (3, 4), (5, 7)]
    assert ranked_pairs(texts, scores, 8) == [(0, 1), (3, 4), (5, 7)]  # the fourth would be b (0) against e (0.5): stop
    assert ranked_pairs(["x", "y", "x"], [1.0, 1.0, 1.0], 3) == []  # nothing to prefer


def rft_config(root, *extra: str) -> RFTConfig:
    """Rejection sampling over the six prompts with the `has_e` reward: 3 samples of 8 tokens, tiny SFT."""
    return load_config(RFTConfig, None, [f"base={json.dumps(str(root / 'base'))}",
                                         f"rft.prompts={json.dumps([str(root / 'prompts.jsonl')])}",
                                         'rft.rewards=["reward_mod:has_e"]', "rft.samples=3", "rft.max_new_tokens=8",
                                         "rft.eval_count=0", "train.seq_len=64", "train.batch_size=2",
                                         "log.progress=false", "eval.at_end=false", *extra])


def test_rejection_sampling_rounds(root, tmp_path):
    cfg = rft_config(root, "rft.rounds=2", "train.max_steps=2")
    history = rft(cfg, tmp_path / "out")
    assert [h["round"] for h in history] == [1, 2] and all(h["kept"] == 6 for h in history)
    assert history[1]["base"] == str(tmp_path / "out" / "round_01" / "run")
    kept = [json.loads(x) for x in (tmp_path / "out" / "round_01" / "samples.jsonl").read_text().splitlines()]
    assert all(k["messages"][-1]["role"] == "assistant" for k in kept)
    assert metrics(tmp_path / "out" / "round_02" / "run")[0]
    again = rft(cfg, tmp_path / "out")  # finished rounds are reused
    assert again == history


def test_rejection_sampling_stopped_mid_training_resumes_exactly(root, tmp_path):
    """A round whose SFT run stopped after its step-2 checkpoint continues to the same weights and losses."""
    import shutil

    from groundup.layout import SUMMARY_FILE
    from groundup.posttrain.rft import ROUNDS_FILE

    cfg = rft_config(root, "train.max_steps=4", "checkpoint.every=2")
    history = rft(cfg, tmp_path / "whole")
    shutil.copytree(tmp_path / "whole", tmp_path / "out")
    run = tmp_path / "out" / "round_01" / "run"
    for path in (tmp_path / "out" / ROUNDS_FILE, run / SUMMARY_FILE, run / "checkpoints" / "step_0000004" / "meta.json"):
        path.unlink()  # as a crash between the step-2 checkpoint and the end of the round leaves it
    assert rft(cfg, tmp_path / "out") == history
    assert_same_steps(tmp_path / "whole" / "round_01" / "run", run, 4)


def test_rejection_sampling_stopped_mid_sampling_continues_to_the_same_samples(root, tmp_path, monkeypatch):
    import groundup.posttrain.rft as rft_module

    cfg = rft_config(root, "train.max_steps=1")
    monkeypatch.setattr(rft_module, "SAMPLE_ROWS", 3)  # one prompt's samples a batch,
    monkeypatch.setattr(rft_module, "SAMPLE_CHUNK", 2)  # two prompts a chunk: the 6 prompts in three chunks
    rft(cfg, tmp_path / "whole")
    real, calls = rft_module.best_completions, []

    def stop_at_third_chunk(gen, part, *args, **kwargs):
        calls.append(len(part))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(gen, part, *args, **kwargs)

    monkeypatch.setattr(rft_module, "best_completions", stop_at_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        rft(cfg, tmp_path / "out")
    round_dir = tmp_path / "out" / "round_01"
    assert json.loads((round_dir / "samples.jsonl.progress.json").read_text())["prompts_done"] == 4
    with pytest.raises(DataError, match=r"rewards: \['reward_mod:has_e'\] -> \['exact_match'\]"):
        rft(rft_config(root, "train.max_steps=1", 'rft.rewards=["exact_match"]'), tmp_path / "out")
    resumed = []
    monkeypatch.setattr(rft_module, "best_completions", lambda gen, part, *a, **k: resumed.append(len(part)) or
                        real(gen, part, *a, **k))
    history = rft(cfg, tmp_path / "out")  # the last chunk is sampled, then the round trains
    assert resumed == [2]
    assert (round_dir / "samples.jsonl").read_bytes() == (tmp_path / "whole" / "round_01" / "samples.jsonl").read_bytes()
    assert history[0]["kept"] == 6 and history[0]["samples"] == 18
    assert history == rft(cfg, tmp_path / "whole")


def pairs_run(root, out, *extra):
    """`groundup data pairs` in this process (so a test can stop it part-way)."""
    import argparse

    from groundup.posttrain.data_commands import pairs, pairs_arguments

    parser = argparse.ArgumentParser()
    pairs_arguments(parser)
    return pairs(parser.parse_args(["--model", str(root / "base"), "--prompts", str(root / "prompts.jsonl"), "--reward",
                                    "reward_mod:has_e", "--out", str(out), "--samples", "4", "--max-new-tokens", "12",
                                    "--batch-size", "6", "--device", "cpu", "--no-progress", *extra]))


def test_pairs_stopped_part_way_resume_to_the_same_file(root, tmp_path, monkeypatch):
    import groundup.posttrain.sampled_data as sampled

    whole = tmp_path / "whole.jsonl"
    pairs_run(root, whole)  # one chunk: the 6 prompts' 24 samples in four batches of 6 rows
    out = tmp_path / "p.jsonl"
    real, calls = sampled.make_pairs, []

    def stop_at_second_chunk(gen, part, *args, **kwargs):
        calls.append(len(part))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(gen, part, *args, **kwargs)

    monkeypatch.setattr(sampled, "make_pairs", stop_at_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        pairs_run(root, out, "--chunk", "1")  # rounded up to 3 prompts: 12 rows, two whole batches
    assert calls == [3, 3] and not out.exists()
    record = json.loads((tmp_path / "p.jsonl.progress.json").read_text())
    partial = tmp_path / "p.jsonl.partial"
    assert record["prompts_done"] == 3 and record["bytes"] == partial.stat().st_size > 0
    assert whole.read_bytes().startswith(partial.read_bytes())  # the first chunk's pairs, as the whole run wrote them
    with pytest.raises(DataError, match=r"unfinished run is here \(3 prompts done.*pass --resume"):
        pairs_run(root, out)
    with pytest.raises(DataError, match=r"cannot resume.*seed: 0 -> 1"):
        pairs_run(root, out, "--resume", "--seed", "1")
    progress = tmp_path / "p.jsonl.progress.json"
    for key, value, where in (("bytes", "12", "bytes"), ("prompts_done", -1, "prompts_done"), ("counts", [], "counts"),
                              ("counts", {"kept": "3"}, "counts.kept"), ("failure_examples", None, "failure_examples")):
        progress.write_text(json.dumps({**record, key: value}))  # valid JSON of the wrong shape: one line
        with pytest.raises(DataError, match=rf"p.jsonl.progress.json: key '{re.escape(where)}' = .*: expected"):
            pairs_run(root, out, "--resume")
    progress.write_text(json.dumps(record))
    with partial.open("ab") as f:
        f.write(b'{"prompt": "half-writ')  # a chunk cut off mid-write: dropped and redone
    monkeypatch.setattr(sampled, "make_pairs", real)
    pairs_run(root, out, "--resume", "--chunk", "1")
    assert out.read_bytes() == whole.read_bytes()
    assert not partial.exists() and not (tmp_path / "p.jsonl.progress.json").exists()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p.jsonl", "whole.jsonl"]  # no lock file left behind
    with pytest.raises(DataError, match="nothing to resume"):
        pairs_run(root, tmp_path / "never.jsonl", "--resume")
    (tmp_path / "first.jsonl.partial").write_text('{"prompt": "cut off in the first chunk')  # nothing finished:
    pairs_run(root, tmp_path / "first.jsonl", "--chunk", "1")  # started again without a question
    assert (tmp_path / "first.jsonl").read_bytes() == whole.read_bytes()
    with pytest.raises(DataError, match="already exists"):
        pairs_run(root, out)
