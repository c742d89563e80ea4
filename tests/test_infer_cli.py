"""`groundup generate` and `groundup chat`: outputs, piped chat sessions, and clear errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from groundup.cli import main
from groundup.infer import Generator, SamplingConfig
from groundup.infer.chat import ChatSession, run_chat
from infer_helpers import model_dir, small_tokenizer, tiny_model


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return model_dir(tmp_path_factory.mktemp("cli") / "model", tiny_model(max_seq_len=64))


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_prints_the_prompt_and_its_greedy_completion(ckpt, capsys):
    expected = Generator.from_checkpoint(ckpt).generate(["To be"], max_new_tokens=12, temperature=0)[0]
    code, out, err = _run(capsys, "generate", "--checkpoint", ckpt, "--prompt", "To be", "--max-new-tokens", 12,
                          "--temperature", 0)
    assert code == 0 and out == "To be" + expected + "\n"
    assert "1 completion in" in err


def test_generate_batches_prompts_from_a_file_and_prints_json(ckpt, capsys, tmp_path):
    prompts = ["To be", "", "My lord", "Hello there", "A"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    code, out, err = _run(capsys, "generate", "--checkpoint", ckpt, "--prompts-file", tmp_path / "prompts.txt",
                          "--batch-size", 3, "--max-new-tokens", 8, "--temperature", 0, "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    kept = [p for p in prompts if p]
    assert code == 0 and [r["prompt"] for r in rows] == kept and [r["index"] for r in rows] == [0, 1, 2, 3]
    expected = Generator.from_checkpoint(ckpt).generate(kept, max_new_tokens=8, temperature=0)
    assert [r["completion"] for r in rows] == expected
    assert all(r["completion_tokens"] <= 8 and r["finish_reason"] in ("stop", "length") for r in rows)
    assert "skipped 1 blank lines" in err and "4 completions" in err


@pytest.mark.parametrize("args, message", [
    (["--prompt", "Hi", "--temperature", "-1"], "temperature = -1.0: expected a number >= 0"),
    (["--prompt", "Hi", "--top-p", "0"], r"top_p = 0.0: expected a number in (0, 1]"),
    (["--prompt", "Hi", "--top-p", "1.2"], r"top_p = 1.2: expected a number in (0, 1]"),
    (["--prompt", "Hi " * 80], "tokens but the model's context is 64"),
    ([], "no prompts: pass --prompt TEXT or --prompts-file FILE"),
    (["--prompts-file", "/nonexistent/prompts.txt"], "prompts file not found"),
])
def test_generate_reports_bad_input_without_a_traceback(ckpt, capsys, args, message):
    code, out, err = _run(capsys, "generate", "--checkpoint", ckpt, *args)
    assert code == 2 and err.startswith("error: ") and message in err and "Traceback" not in err


def test_generate_left_truncates_on_request(ckpt, capsys):
    code, out, _ = _run(capsys, "generate", "--checkpoint", ckpt, "--prompt", "Hi " * 80, "--truncate",
                        "--max-new-tokens", 4, "--json")
    assert code == 0 and json.loads(out)["prompt_tokens"] == 60


def test_missing_checkpoint_and_tokenizer_are_clear_errors(tmp_path, capsys):
    code, _, err = _run(capsys, "generate", "--checkpoint", tmp_path / "none", "--prompt", "Hi")
    assert code == 2 and "no such checkpoint or run directory" in err
    model_dir(tmp_path / "m")
    (tmp_path / "m" / "tokenizer" / "tokenizer.json").unlink()
    code, _, err = _run(capsys, "chat", "--checkpoint", tmp_path / "m")
    assert code == 2 and "no tokenizer found beside the checkpoint" in err and "Traceback" not in err


def test_chat_session_keeps_history_within_the_context():
    gen = Generator(tiny_model(max_seq_len=64), small_tokenizer())
    session = ChatSession(gen, SamplingConfig.make(max_new_tokens=8, temperature=0), system="Be brief.")
    for i in range(6):
        "".join(session.reply(f"Question number {i}, please?"))
        ids, _ = gen.tokenizer.render_chat(session.messages[:-1], add_generation_prompt=True)
        assert len(ids) <= 64 - 8
    assert session.dropped > 0 and session.messages[0] == {"role": "system", "content": "Be brief."}
    assert session.messages[-2] == {"role": "user", "content": "Question number 5, please?"}
    session.reset()
    assert session.messages == [{"role": "system", "content": "Be brief."}]


def test_chat_loop_resets_reports_overlong_messages_and_exits():
    gen = Generator(tiny_model(max_seq_len=64), small_tokenizer())
    session = ChatSession(gen, SamplingConfig.make(max_new_tokens=8, temperature=0))
    out = io.StringIO()
    replies = run_chat(session, io.StringIO("Hello\n\n/reset\n" + "word " * 60 + "\nAgain\n/exit\nnever read\n"), out)
    text = out.getvalue()
    assert replies == 2 and "(conversation reset)" in text and "send something shorter" in text
    assert text.count("assistant> ") == 3  # two replies and the refused message
    assert session.messages[0] == {"role": "user", "content": "Again"}  # history restarted at /reset


def test_chat_command_reads_piped_stdin(ckpt):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "groundup", "chat", "--checkpoint", str(ckpt), "--temperature", "0",
                           "--max-new-tokens", "6", "--system", "Answer briefly."],
                          input="Hello there\n/reset\nWhat is 2+3?\n", capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("assistant> ") == 2 and "(conversation reset)" in proc.stdout
    gen = Generator.from_checkpoint(ckpt)
    expected = "".join(gen.chat([{"role": "system", "content": "Answer briefly."},
                                 {"role": "user", "content": "What is 2+3?"}], max_new_tokens=6, temperature=0))
    assert f"assistant> {expected}\n" in proc.stdout
