"""Skipped input is said where the user looks, the console, not only in a report file (issue 28): sft's
unreadable files and invalid lines, a custom eval task's bad records, and --eval-data with nothing usable
(sft, dpo, kto, reward-model) or --eval-prompts with nothing usable (grpo, rft)."""

from __future__ import annotations

import json

import pytest

from groundup.cli import main
from infer_helpers import model_dir, small_tokenizer, tiny_model

CHATS = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                       {"role": "assistant", "content": f"{2 * i}"}]} for i in range(24)]
SFT = ["train.max_steps=1", "train.seq_len=64", "train.batch_size=2", "train.threads=2", "log.progress=false",
       "eval.at_end=false", "eval.every=0", "sft.eval_generations=0"]


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("base") / "model", tiny_model(max_seq_len=64), small_tokenizer())


def _jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_sft_prints_unreadable_files_and_invalid_lines(base, tmp_path, capsys):
    data = _jsonl(tmp_path / "chat.jsonl", CHATS[:10] + ["{not json", '{"messages": ['] + CHATS[10:])
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not a parquet file")
    code, out, _ = cli(capsys, "sft", "--base", base, "--data", data, tmp_path / "broken.parquet",
                       "--out", tmp_path / "run", *SFT)
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("--data: skipped"))
    assert line.startswith("--data: skipped 3 input problem(s) (")
    assert "2 bad json" in line and "1 unreadable files" in line
    assert f"{data}:11" in line and "broken.parquet: not a readable Parquet file" in line  # where, and why
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())["read"]
    assert report["bad_json"] == 2 and report["unreadable_files"] == 1


def test_sft_refuses_eval_data_without_a_usable_example(base, tmp_path, capsys):
    data = _jsonl(tmp_path / "chat.jsonl", CHATS)
    held = _jsonl(tmp_path / "held.jsonl", [{"question": "no known format"}, "{not json"])
    code, out, err = cli(capsys, "sft", "--base", base, "--data", data, "--eval-data", held,
                         "--out", tmp_path / "run", *SFT)
    assert code == 2 and "no held-out data" not in out
    assert f"error: --eval-data {held}: no usable held-out example (" in err
    assert f"{held}:1: no known format" in err and f"{held}:2" in err

    long = _jsonl(tmp_path / "long.jsonl", [{"messages": [{"role": "user", "content": "word " * 200},
                                                          {"role": "assistant", "content": "ok"}]}])
    code, _, err = cli(capsys, "sft", "--base", base, "--data", data, "--eval-data", long,
                       "--out", tmp_path / "run2", *SFT)
    assert code == 2 and f"--eval-data {long}: none of its 1 examples can be scored (1 longer than" in err


PAIRS = [{"prompt": f"What is {i} + 1?", "chosen": f" {i + 1}", "rejected": f" {i + 2}"} for i in range(8)]
FEEDBACK = [{"prompt": f"What is {i} + 1?", "completion": f" {i + 1 + i % 2}", "label": i % 2 == 0} for i in range(8)]


@pytest.mark.parametrize("verb, records", [("dpo", PAIRS), ("kto", FEEDBACK), ("reward-model", PAIRS)])
def test_preference_verbs_refuse_eval_data_without_a_usable_record(base, tmp_path, capsys, verb, records):
    data = _jsonl(tmp_path / "train.jsonl", records)
    held = _jsonl(tmp_path / "held.jsonl", [{"prompt": "only a prompt"}])
    code, out, err = cli(capsys, verb, "--base", base, "--data", data, "--eval-data", held, "--out", tmp_path / "run",
                         "train.max_steps=1", "train.seq_len=64", "train.batch_size=2", "log.progress=false")
    assert code == 2 and "no held-out" not in out
    assert f"error: --eval-data {held}: no usable" in err and f"(1 read; first: {held}:1: expected" in err


def test_eval_prints_a_custom_tasks_skipped_records(base, tmp_path, capsys):
    records = [{"q": "Is 1 a number?", "options": ["yes", "no"], "answer": 0}, {"question": "no q"},
               {"q": "Is 2 a number?", "options": ["yes", "no"], "answer": 5}]
    _jsonl(tmp_path / "items.jsonl", records)
    (tmp_path / "task.toml").write_text('name = "yesno"\ndata = "items.jsonl"\ncontext = "Q: {q}\\nA:"\n'
                                        'choices = "options"\ngold = "answer"\n')
    code, _, err = cli(capsys, "eval", "--model", base, "--tasks", tmp_path / "task.toml", "--no-progress",
                       "--json")
    assert code == 0
    assert (f"note: task yesno: skipped 2 record(s) of {tmp_path / 'items.jsonl'}: items.jsonl:2: missing field 'q' "
            "(context); items.jsonl:3: field 'answer' = 5 is out of range for 2 choices (gold)\n") in err


@pytest.mark.parametrize("verb", ["grpo", "rft"])
def test_eval_prompts_without_a_usable_prompt_are_refused(base, tmp_path, capsys, verb):
    prompts = _jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(4)])
    held = _jsonl(tmp_path / "held.jsonl", [{"question": "no prompt field"}])
    extra = ["train.max_steps=1", "grpo.max_new_tokens=8"] if verb == "grpo" else ["rft.rounds=1", "rft.max_new_tokens=8"]
    code, out, err = cli(capsys, verb, "--base", base, "--prompts", prompts, "--eval-prompts", held,
                         "--out", tmp_path / "run", "--reward", "exact_match", "log.progress=false", *extra)
    assert code == 2 and "held out" not in out, (out, err)
    assert f"error: --eval-prompts {held}: no usable prompt (1 skipped; first: {held}:1: expected" in err
