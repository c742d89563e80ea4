"""Process reward models: step splitting, Math-Shepherd labels, the loss at step ends, best-of-n by the lowest
step score, the `prm:PATH` reward, `rm --process` end to end, and resume of the labelling after a kill."""

from __future__ import annotations

import json
import math

import pytest
import torch

from groundup.config import load_config
from groundup.errors import DataError
from groundup.infer.engine import Completion
from groundup.layout import PROCESS_REWARD_FILE, STEP_LABELS_FILE
from groundup.model.heads import RewardScore
from groundup.posttrain import prm_labels
from groundup.posttrain.config import PRMSection, RMConfig
from groundup.posttrain.prm import ProcessRewardObjective, StepItem, make_step_batch, process_rm
from groundup.posttrain.prm_labels import LabellingStopped, label_job, label_prompts
from groundup.posttrain.rollout import Prompt
from groundup.rewards.functions import Reward, exact_match, load_reward, parse_reward_args, score
from groundup.rewards.process_scorer import best_of_n, split_steps, step_rows, step_tokens
from infer_helpers import model_dir, small_tokenizer, tiny_model
from train_helpers import run_cli

SOLUTIONS = ["2 + 3 = 5\n5 * 4 = 20\nAnswer: 20", "2 + 3 = 6\n6 * 4 = 24\nAnswer: 24"]
# of N = 4 completions sampled from each step prefix, how many reach the answer (20)
GOOD = {"2 + 3 = 5": 3, "2 + 3 = 5\n5 * 4 = 20": 4, "2 + 3 = 6": 1, "2 + 3 = 6\n6 * 4 = 24": 0}
QUESTION = "What is (2 + 3) * 4?"


def test_steps_split_losslessly_at_lines_sentences_and_markers():
    text = "2 + 3 = 5. 5 * 4 = 20.\n\nAnswer: 20\n"
    assert split_steps(text, "lines") == ["2 + 3 = 5. 5 * 4 = 20.", "\n\nAnswer: 20\n"]
    assert split_steps(text, "sentences") == ["2 + 3 = 5.", " 5 * 4 = 20.", "\n\nAnswer: 20\n"]
    assert split_steps("a ки b ки c", "ки") == ["a ки", " b ки", " c"]
    assert split_steps("x = 3.5 then\n", "sentences") == ["x = 3.5 then\n"]  # no whitespace after "3.": one step
    assert split_steps("", "lines") == [] and split_steps(" \n ", "lines") == []
    for split in ("lines", "sentences", "ки"):
        assert "".join(split_steps(text, split)) == text


class ScriptedGen:
    """Completions known in advance: a bare prompt row gets SOLUTIONS[seed % 2]; a row ending in a step
    prefix gets the right answer when seed % 4 < GOOD[prefix] (N = 4 consecutive seeds: exactly GOOD right)."""

    def __init__(self, tok, prompt_ids, fail_after: int | None = None):
        self.tok, self.prompt_ids, self.calls, self.fail_after = tok, prompt_ids, 0, fail_after

    def complete_ids(self, rows, seed=0, **_):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt  # a kill in the middle of the job
        outs = []
        for r, row in enumerate(rows):
            prefix = self.tok.decode(row[len(self.prompt_ids):])
            if not prefix:
                text = SOLUTIONS[(seed + r) % 2]
            else:
                text = "\nAnswer: 20" if (seed + r) % 4 < GOOD[prefix] else "\nAnswer: 21"
            outs.append(Completion(text, [], "stop", len(row)))
        return outs


def _prompts(tok, n=1):
    ids = tok.encode(QUESTION)
    return [Prompt(ids, QUESTION, {"answer": "20", "n": i}) for i in range(n)], ids


@pytest.mark.parametrize("estimation", ["hard", "soft"])
def test_math_shepherd_labels_are_the_closed_form_on_a_scripted_sampler(estimation):
    tok = small_tokenizer()
    prompts, ids = _prompts(tok)
    prm = PRMSection(enabled=True, solutions=2, completions=4, estimation=estimation, batch_rows=3)
    records, counts = label_prompts(ScriptedGen(tok, ids), tok, prompts, prm, Reward("exact_match", exact_match),
                                    seed=0, index={id(prompts[0]): 0})
    assert [r["steps"] for r in records] == [split_steps(s, "lines") for s in SOLUTIONS]
    assert [r["correct"] for r in records] == [True, False]
    assert [r["reached"] for r in records] == [[3, 4, None], [1, 0, None]]
    closed = {"hard": [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], "soft": [[0.75, 1.0, 1.0], [0.25, 0.0, 0.0]]}
    assert [r["labels"] for r in records] == closed[estimation]
    assert counts["completions"] == 2 * 2 * 4 and counts["right"] == 1 and records[0]["answer"] == "20"


def test_labelling_resumes_after_a_kill_and_writes_the_same_file(tmp_path):
    tok = small_tokenizer()
    prompts, ids = _prompts(tok, n=3)
    prm = PRMSection(enabled=True, solutions=2, completions=4, chunk=1)
    correct = Reward("exact_match", exact_match)
    label_job(tmp_path / "whole.jsonl", {"s": 1}, ScriptedGen(tok, ids), tok, prompts, prm, correct, 5, progress=False)
    out = tmp_path / "labels.jsonl"
    with pytest.raises(KeyboardInterrupt):  # killed in the second chunk: the first is on disk
        label_job(out, {"s": 1}, ScriptedGen(tok, ids, fail_after=3), tok, prompts, prm, correct, 5, progress=False)
    assert not out.exists() and len(out.with_name(out.name + ".partial").read_text().splitlines()) == 2
    gen = ScriptedGen(tok, ids)
    state = label_job(out, {"s": 1}, gen, tok, prompts, prm, correct, 5, progress=False)
    assert gen.calls == 2 * 2  # only the two prompts left were sampled again (solutions, then completions)
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes() and state["counts"]["solutions"] == 6
    killed = tmp_path / "killed.jsonl"  # an unfinished job continues only with the settings it started with
    with pytest.raises(KeyboardInterrupt):
        label_job(killed, {"s": 1}, ScriptedGen(tok, ids, fail_after=3), tok, prompts, prm, correct, 5, progress=False)
    with pytest.raises(DataError, match=r"other settings \(s: 1 -> 2\)"):
        label_job(killed, {"s": 2}, ScriptedGen(tok, ids), tok, prompts, prm, correct, 5, progress=False)


def test_a_signal_stops_the_labelling_between_chunks_keeping_them(tmp_path):
    tok = small_tokenizer()
    prompts, ids = _prompts(tok, n=3)
    prm, stop = PRMSection(enabled=True, solutions=2, completions=4, chunk=1), {}
    gen = ScriptedGen(tok, ids)
    gen.complete_ids = lambda rows, _real=gen.complete_ids, **kw: (stop.update(signal="SIGTERM"), _real(rows, **kw))[1]
    out = tmp_path / "labels.jsonl"
    with pytest.raises(LabellingStopped, match="stopped by SIGTERM after 1 of 3 prompts"):
        label_job(out, {"s": 1}, gen, tok, prompts, prm, Reward("exact_match", exact_match), 5, progress=False,
                  stop=stop)
    assert len(out.with_name(out.name + ".partial").read_text().splitlines()) == 2  # the first prompt's solutions


def test_steps_are_read_as_the_model_writes_them():
    tok = small_tokenizer()
    steps = split_steps("9 - 4 = 5.\nAnswer: 5 ки", "sentences")
    tokens, ends = step_tokens(tok, steps)
    assert len(steps) == 2 and tokens == tok.encode("".join(steps))  # the text encoded whole: a boundary inside a token changes none
    text = "".join(steps)
    for step_end, e in zip([len("9 - 4 = 5."), len(text.rstrip())], ends):  # the token holding the step's last char
        before = sum(len(tok.id_to_bytes(t)) for t in tokens[:e])
        assert before < len(text[:step_end].encode()) <= before + len(tok.id_to_bytes(tokens[e]))


def test_loss_is_binary_cross_entropy_at_step_ends_only():
    tok = small_tokenizer()
    conv = [{"role": "user", "content": QUESTION}]
    ids, ends = step_rows(tok, conv, ["2 + 3 = 5", "\nAnswer: 20"])
    prompt, _ = tok.render_chat(conv, add_generation_prompt=True)
    assert ends[-1] == len(ids) - 1 and prompt == ids[: len(prompt)] and ends[0] < ends[1]
    item = StepItem(prompt, ids, ends, [1.0, 0.0])
    model = tiny_model(value_head=True)
    out = ProcessRewardObjective([], tok.pad_id or 0)(model, make_step_batch([item], 0), "cpu")
    x = torch.tensor([ids])
    with torch.no_grad():
        z = [float(model(x[:, : e + 1], head=RewardScore(torch.tensor([e]))).rewards[0]) for e in ends]  # one end at a time
    sig = [1 / (1 + math.exp(-v)) for v in z]
    hand = -(math.log(sig[0]) + math.log(1 - sig[1])) / 2  # labels 1 then 0
    assert float(out.loss.detach()) == pytest.approx(hand, rel=1e-5)
    assert float(out.metrics["accuracy"]) == ((z[0] > 0) + (z[1] <= 0)) / 2
    # a position that is not a step end never reaches the loss: a longer row scored at the same ends
    longer = StepItem(prompt, ids + [5, 6, 7], ends, [1.0, 0.0])
    again = ProcessRewardObjective([], 0)(model, make_step_batch([longer], 0), "cpu")
    assert float(again.loss.detach()) == pytest.approx(hand, rel=1e-5)


def test_best_of_n_keeps_the_candidate_whose_lowest_step_is_highest():
    scores = [[0.9, 0.2, 0.95], [0.6, 0.7, 0.65], [0.99, 0.1, 0.99]]  # mean or last step would pick 2 or 0
    assert best_of_n(scores) == 1
    assert best_of_n([[0.5], [0.5, 0.9]]) == 0  # a tie goes to the earlier candidate
    with pytest.raises(ValueError):
        best_of_n([])


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("prm")
    path = model_dir(root / "prm", tiny_model(seed=3, value_head=True), small_tokenizer())
    (path / PROCESS_REWARD_FILE).write_text(json.dumps({"split": "lines"}))
    return path


def test_prm_reward_is_the_lowest_step_score(prm_dir):
    tok, model = small_tokenizer(), tiny_model(seed=3, value_head=True)
    reward = load_reward(f"prm:{prm_dir}")
    messages = [{"role": "system", "content": "Show your working."}, {"role": "user", "content": QUESTION}]
    reply = SOLUTIONS[0]
    ids, ends = step_rows(tok, messages, split_steps(reply, "lines"))
    direct = [torch.sigmoid(model(torch.tensor([ids]), head=RewardScore(torch.tensor([e]))).rewards[0]).item()
              for e in ends]
    assert len(direct) == 3 and max(direct) - min(direct) > 1e-4  # the steps score differently
    assert reward.step_scores(QUESTION, reply, messages) == pytest.approx(direct, abs=1e-5)
    assert reward(QUESTION, reply, messages=messages) == pytest.approx(min(direct), abs=1e-5)
    total, parts, error = score([Reward("prm", reward)], QUESTION, reply, {"answer": "20"}, messages)  # GRPO's path
    assert error is None and total == pytest.approx(min(direct), abs=1e-5)
    assert parse_reward_args([f"prm:{prm_dir}"]) == ([f"prm:{prm_dir}"], [1.0])
    with pytest.raises(Exception, match="not a process reward model"):
        load_reward(f"prm:{prm_dir.parent}")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("prm-base")
    model_dir(root / "base", tiny_model(max_seq_len=128), small_tokenizer())
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}], "answer": str(2 * i)} for i in range(6)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


TINY_PRM = ["prm.solutions=2", "prm.completions=2", "prm.max_new_tokens=6", "prm.chunk=2", "prm.correct=format_answer",
            "train.seq_len=64", "train.batch_size=4", "train.max_steps=2", "log.every=1", "log.progress=false",
            "eval.every=0", "checkpoint.every=2", "rm.val_fraction=0"]


def test_rm_process_end_to_end_writes_a_checkpoint_that_loads(base, tmp_path):
    out = tmp_path / "prm"
    run_cli("rm", "--process", "--model", str(base / "base"), "--data", str(base / "prompts.jsonl"), "--out", str(out),
            "--quiet", *TINY_PRM)
    labels = [json.loads(line) for line in (out / STEP_LABELS_FILE).read_text().splitlines()]
    assert len(labels) == 6 * 2 and all(len(r["labels"]) == len(r["steps"]) for r in labels)
    assert json.loads((out / PROCESS_REWARD_FILE).read_text())["split"] == "lines"
    assert (out / "checkpoints" / "step_0000002" / "model.safetensors").is_file()
    reward = load_reward(f"prm:{out}")
    value = reward("What is 2 + 2?", "2 + 2 = 4\nAnswer: 4")
    assert 0 < value < 1 and len(reward.step_scores("What is 2 + 2?", "2 + 2 = 4\nAnswer: 4")) == 2


def test_rm_process_resumes_its_labelling_after_a_kill(base, tmp_path, monkeypatch):
    cfg = load_config(RMConfig, None, [f"base={json.dumps(str(base / 'base'))}", "prm.enabled=true",
                                       f"rm.data={json.dumps([str(base / 'prompts.jsonl')])}", *TINY_PRM])
    process_rm(cfg, tmp_path / "whole")
    real, calls = prm_labels.label_prompts, []

    def killed_in_the_second_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(prm_labels, "label_prompts", killed_in_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        process_rm(cfg, tmp_path / "run")
    monkeypatch.setattr(prm_labels, "label_prompts", real)
    assert not (tmp_path / "run" / STEP_LABELS_FILE).exists()  # the first chunk (2 prompts x 2 solutions) is kept
    assert len((tmp_path / "run" / f"{STEP_LABELS_FILE}.partial").read_text().splitlines()) == 4
    summary = process_rm(cfg, tmp_path / "run", resume=True)
    assert summary["steps"] == 2
    assert (tmp_path / "run" / STEP_LABELS_FILE).read_bytes() == (tmp_path / "whole" / STEP_LABELS_FILE).read_bytes()


def test_rm_process_trains_on_records_already_labelled_and_names_bad_ones(base, tmp_path):
    rows = [{"prompt": f"What is {i} + {i}?", "steps": [f"{i} + {i} = {2 * i}", f"\nAnswer: {2 * i}"],
             "labels": [1, 1 if i % 2 else 0]} for i in range(8)]
    rows.append({"prompt": "What is 1 + 1?", "steps": ["1 + 1 = 2", "\nAnswer: 2"], "labels": [1]})
    data = tmp_path / "labelled.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(RMConfig, None, [f"base={json.dumps(str(base / 'base'))}", "prm.enabled=true",
                                       f"rm.data={json.dumps([str(data)])}", *TINY_PRM])
    summary = process_rm(cfg, tmp_path / "run")
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert summary["steps"] == 2 and not (tmp_path / "run" / STEP_LABELS_FILE).exists()  # nothing to label
    assert report["solutions"] == 8 and report["steps"] == 16 and report["mean_label"] == 12 / 16
    assert report["skipped"] == [f"{data}:9: 'labels' must be a list of 2 numbers, one per step"]
