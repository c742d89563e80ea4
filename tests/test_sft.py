"""Supervised fine-tuning: every data format, loss masks, packing against its definition, LoRA, exact
resume, replay, merge, and bad records counted with file:line."""

from __future__ import annotations

import json

import pytest
import torch

from groundup.config import load_config
from groundup.data.readers import ReadStats
from groundup.model.loss import IGNORE_INDEX
from groundup.posttrain.config import SFTConfig
from groundup.posttrain.records import iter_examples
from groundup.rewards.functions import extract_answer
from groundup.posttrain.sft import sft
from groundup.posttrain.sft_data import collate, pack, tokenize
from infer_helpers import model_dir, small_tokenizer, tiny_model
from train_helpers import assert_resumes_exactly, make_shards, metrics, run_cli

RECORDS = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "4"}]},
    {"prompt": "The capital of France is", "completion": " Paris."},
    {"prompt": [{"role": "user", "content": "Say hi"}], "completion": [{"role": "assistant", "content": "hi"}]},
    {"text": "To be, or not to be."},
    {"conversations": [{"from": "human", "value": "Name a colour"}, {"from": "gpt", "value": "Blue"}]},
    {"instruction": "Add the numbers", "input": "3 4", "output": "7"},
]


def _write(path, records):
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in records))
    return path


def test_every_format_is_read_and_masked(tmp_path):
    tok = small_tokenizer()
    examples = list(iter_examples([_write(tmp_path / "d.jsonl", RECORDS)]))
    assert [e.format for e in examples] == ["messages", "prompt-completion", "prompt-completion", "text", "sharegpt",
                                            "alpaca"]
    for ex in examples:
        t = tokenize(ex, tok, "assistant")
        learned = tok.decode([i for i, m in zip(t.ids, t.mask) if m], skip_special_tokens=True)
        expected = {"messages": "4", "sharegpt": "Blue", "alpaca": "7", "text": "To be, or not to be."}
        if ex.format in expected:
            assert learned == expected[ex.format]
        if ex.messages:  # the end of turn is learned: the model learns to stop
            assert t.mask[-1] == 1 and t.ids[-1] == tok.end_of_turn_id
    chat = tokenize(examples[0], tok, "all")
    assert sum(chat.mask) == len(chat.ids) - 1
    pc = tokenize(examples[1], tok, "completion")
    assert tok.decode([i for i, m in zip(pc.ids, pc.mask) if m], skip_special_tokens=True) == " Paris."


def test_bad_records_are_counted_with_file_and_line(tmp_path):
    path = _write(tmp_path / "bad.jsonl", RECORDS[:1] + [
        {"messages": [{"role": "user", "content": "no answer"}]}, {"prompt": "p", "completion": ""},
        {"conversations": [{"from": "alien", "value": "x"}]}, "not json", {"nothing": 1}])
    stats, bad = ReadStats(), []
    assert len(list(iter_examples([path], stats, bad))) == 1
    assert len(bad) == 4 and all(b.startswith(f"{path}:") for b in bad)
    assert any("must end with an assistant message" in b for b in bad) and stats.bad_json == 1


def test_packing_keeps_examples_whole_and_apart():
    """The loss of a packed row equals the token-weighted mean of each example's loss alone."""
    tok = small_tokenizer()
    torch.manual_seed(0)
    model = tiny_model(max_seq_len=128).eval()
    examples = list(iter_examples([_write_tmp(RECORDS)]))
    tokenized = [tokenize(e, tok, "assistant", i) for i, e in enumerate(examples)]
    rows, report = pack(tokenized, 64, tok.pad_id)
    assert report["dropped_examples"] == 0 and sorted(sum((r.examples for r in rows), [])) == list(range(6))
    assert len(rows) < len(examples) and all(len(r.inputs) == 64 for r in rows)
    batch = collate(rows, tok.pad_id)
    with torch.no_grad():
        packed = model(batch.inputs, batch.targets, segments=batch.segments)
        total, count = 0.0, 0
        for t in tokenized:
            x = torch.tensor([t.ids[:-1]])
            y = torch.tensor([[i if m else IGNORE_INDEX for i, m in zip(t.ids[1:], t.mask[1:])]])
            n = int((y != IGNORE_INDEX).sum())
            total, count = total + float(model(x, y).ce_loss) * n, count + n
    assert float(packed.ce_loss) == pytest.approx(total / count, rel=1e-5)
    rows, report = pack(tokenized, 12, tok.pad_id)
    assert report["dropped_examples"] > 0 and report["dropped_tokens"] > 0  # too long for a row: dropped, not cut


def _write_tmp(records):
    import tempfile
    from pathlib import Path

    return _write(Path(tempfile.mkdtemp()) / "d.jsonl", records)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A base model directory and chat data, both on the small tokenizer."""
    root = tmp_path_factory.mktemp("sft")
    model_dir(root / "base", tiny_model(max_seq_len=128), small_tokenizer())
    run_cli("data", "sample", "--chat", "--out", str(root / "chat"), "--domains", "math", "--math-count", "400")
    return root


def _cfg(root, *extra):
    data = json.dumps([str(root / "chat" / "chat-math.jsonl"), str(root / "chat" / "chat-math.heldout.jsonl")])
    return load_config(SFTConfig, None, [f"base={json.dumps(str(root / 'base'))}", f"sft.data={data}",
                                         "train.seq_len=128", "train.batch_size=4", "train.threads=2", "log.every=1",
                                         "log.progress=false", "eval.every=0", "eval.at_end=false",
                                         "checkpoint.every=3", "schedule.peak_lr=3e-3", *extra])


@pytest.mark.parametrize("lora", [False, True])
def test_fine_tuning_lowers_the_loss_and_resumes_exactly(setup, tmp_path, lora):
    extra = ["train.max_steps=6"] + (["lora.rank=4", "lora.alpha=8", "schedule.peak_lr=1e-2"] if lora else [])
    summary = sft(_cfg(setup, *extra), tmp_path / "run")
    steps, _ = metrics(tmp_path / "run")
    assert summary["steps"] == 6 and steps[-1]["loss"] < steps[0]["loss"]
    final = tmp_path / "run" / "checkpoints" / "step_0000006"
    weights = final / ("adapter_model.safetensors" if lora else "model.safetensors")
    assert weights.is_file() and (final / "model.safetensors").is_file() != lora  # LoRA saves the adapter alone
    # Resume from step 3 (the newest checkpoint made unusable) takes the same steps again, bit for bit.
    assert_resumes_exactly(tmp_path / "run", lambda run: sft(_cfg(setup, *extra), run, resume=True), 6, weights.name)


def test_epochs_set_the_steps_and_evaluation_reports_the_task(setup, tmp_path):
    summary = sft(_cfg(setup, "sft.epochs=0.25", "eval.at_end=true", "sft.eval_generations=4",
                       "sft.eval_max_new_tokens=8"), tmp_path / "run")
    rows = json.loads((tmp_path / "run" / "data_report.json").read_text())["rows"]
    assert summary["steps"] == -(-rows // 16)  # a quarter epoch of rows in batches of 4
    assert {"val_loss", "val_end_turn", "val_exact_match_strict", "val_exact_match_lenient"} <= summary["eval"].keys()


def test_replay_draws_a_share_of_each_batch_from_pretraining_shards(tmp_path):
    shards, tok_dir = make_shards(tmp_path / "shards", domains=("math",))
    from groundup.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_dir)
    model_dir(tmp_path / "base", tiny_model(vocab_size=tok.vocab_size, max_seq_len=128), tok)
    run_cli("data", "sample", "--chat", "--out", str(tmp_path / "chat"), "--domains", "math", "--math-count", "200")
    cfg = load_config(SFTConfig, None, [f"base={json.dumps(str(tmp_path / 'base'))}",
                                        f"sft.data={json.dumps([str(tmp_path / 'chat' / 'chat-math.jsonl')])}",
                                        f"sft.replay_shards={json.dumps(str(shards))}", "sft.replay_fraction=0.25",
                                        "train.seq_len=96", "train.batch_size=4", "train.max_steps=3",
                                        "log.progress=false", "eval.at_end=false", "sft.eval_generations=0"])
    sft(cfg, tmp_path / "run")
    steps, _ = metrics(tmp_path / "run")
    assert all(s["replay_share"] == 0.25 for s in steps)
    assert json.loads((tmp_path / "run" / "data_report.json").read_text())["replay_share"] == 0.25


def test_cli_lora_then_merge_then_generate(setup, tmp_path):
    data = setup / "chat" / "chat-math.jsonl"
    run_cli("sft", "--base", str(setup / "base"), "--data", str(data), "--out", str(tmp_path / "run"), "--quiet",
            "lora.rank=4", "train.max_steps=2", "train.seq_len=96", "train.batch_size=2", "eval.at_end=false")
    via_adapter = run_cli("generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "What is 2 + 2?",
                          "--max-new-tokens", "6", "--temperature", "0").stdout
    run_cli("merge", "--adapter", str(tmp_path / "run"), "--out", str(tmp_path / "merged"))
    merged = run_cli("generate", "--checkpoint", str(tmp_path / "merged"), "--prompt", "What is 2 + 2?",
                     "--max-new-tokens", "6", "--temperature", "0").stdout
    assert via_adapter == merged
    again = run_cli("merge", "--adapter", str(tmp_path / "run"), "--out", str(tmp_path / "merged"), check=False)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_answer_extraction():
    assert extract_answer("12 + 5 = 17.\nAnswer: 17", strict=True) == "17"
    assert extract_answer("so it is 1,250 dollars.", strict=True) is None
    assert extract_answer("so it is 1,250 dollars.", strict=False) == "1250"


@pytest.mark.parametrize("verb, files", [("sft", ("--data", "--eval-data")), ("grpo", ("--prompts", "--eval-prompts"))])
def test_overrides_after_a_file_list_are_overrides_not_files(verb, files):
    """argparse hands `key=value` words after an nargs="+" option to its list; both lists give them back."""
    import argparse

    from groundup.posttrain import commands
    from groundup.posttrain.config import GRPOConfig

    p = argparse.ArgumentParser()
    getattr(commands, f"{verb}_arguments")(p)
    args = p.parse_args([files[0], "a.jsonl", "train.grad_accum=3", files[1], "h.jsonl", "train.seed=64",
                         "--out", "run", "train.max_steps=5"])
    if verb == "grpo":
        args.data, args.eval_data = args.prompts, args.eval_prompts
        cfg = commands._stage_config(GRPOConfig, "grpo", args, data_key="prompts", eval_key="eval_prompts")
        data, held = cfg.grpo.prompts, cfg.grpo.eval_prompts
    else:
        cfg = commands._stage_config(SFTConfig, "sft", args)
        data, held = cfg.sft.data, cfg.sft.eval_data
    assert (cfg.train.grad_accum, cfg.train.seed, cfg.train.max_steps) == (3, 64, 5)
    assert (data, held) == (["a.jsonl"], ["h.jsonl"])


def test_held_out_replies_keep_their_prompt_when_max_new_tokens_fills_the_context():
    """A reply gets the room its prompt leaves: asking for as many new tokens as the context holds must not
    cut the prompt (it used to be left-truncated to one token, so SFT logged 0% exact match)."""
    from groundup.infer import Generator
    from groundup.posttrain.chat_eval import chat_replies
    from groundup.posttrain.records import Example

    tok, model = small_tokenizer(), tiny_model(max_seq_len=48)
    messages = [{"role": "user", "content": "What is 3 + 4? Say it plainly."}, {"role": "assistant", "content": "7"}]
    ex = Example("q", "messages", messages, completion_at=1, meta={"answer": "7"})
    ids = tok.render_chat(messages[:1], add_generation_prompt=True)[0]
    assert 4 < len(ids) < 24
    got = chat_replies(model, tok, [ex], max_new_tokens=48)[0]
    want = Generator(model, tok).complete_ids([ids], max_new_tokens=48 - len(ids), temperature=0)[0]
    assert got.token_ids == want.token_ids and len(got.token_ids) == 48 - len(ids)
