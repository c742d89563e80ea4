"""`groundup generate` and `groundup chat` with --tools: a tiny model made to write a calculator call and then an
answer (tool_script.Script), run through the real command lines; the calls and results printed as they happen,
a failing call shown as its error result, the history kept whole, and the inputs that cannot work refused."""

from __future__ import annotations

import io
import json

import pytest

from groundup.cli import main
from groundup.infer.chat import ChatSession, run_chat
from groundup.infer.engine import Generator
from groundup.infer.sampling import SamplingConfig
from groundup.tools import ToolRunner, resolve_tools
from infer_helpers import model_dir, small_tokenizer, tiny_model
from tool_script import Script, one_thread  # noqa: F401 - autouse


def call(expression: str) -> str:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    # tools' definitions fill a few hundred tokens of the 512-token vocabulary: a context that holds them
    return model_dir(tmp_path_factory.mktemp("tools_cli") / "m", tiny_model(max_seq_len=2048))


@pytest.fixture
def scripted(monkeypatch):
    """The replies the next model loaded by a command writes, in order."""
    replies: list[str] = []
    load = Generator.from_checkpoint.__func__

    def scripted_load(cls, *args, **kwargs):
        gen = load(cls, *args, **kwargs)
        Script(gen.model, gen.tokenizer, replies)
        return gen

    monkeypatch.setattr(Generator, "from_checkpoint", classmethod(scripted_load))
    return replies


GENERATE = ["--tools", "calculator", "--temperature", "0", "--max-new-tokens", "200"]


def test_generate_shows_the_call_and_its_result_as_they_happen(model_path, scripted, capsys):
    scripted += [call("7 * 8"), "7 * 8 = 56."]
    assert main(["generate", "--model", str(model_path), "--prompt", "What is 7 * 8?", *GENERATE]) == 0
    out, err = capsys.readouterr()
    assert out == 'user> What is 7 * 8?\nassistant> [calculator] {"expression": "7 * 8"}\n-> 56\n7 * 8 = 56.\n'
    assert "1 reply, 1 tool call (0 failed)" in err


def test_generate_json_records_each_turn_and_a_failing_call_is_an_error_result(model_path, scripted, capsys):
    scripted += [call("7 * 8"), "56.", call("1 / 0"), "I cannot divide by zero."]
    argv = ["generate", "--model", str(model_path), "--prompt", "7 * 8?", "--prompt", "1 / 0?", "--batch-size", "1",
            "--json", *GENERATE]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    first, second = [json.loads(line) for line in out.splitlines()]
    assert first["messages"] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "calculator", "arguments": '{"expression": "7 * 8"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "56"},
        {"role": "assistant", "content": "56."}]
    assert (first["completion"], first["tool_calls"], first["tool_errors"], first["finish_reason"]) == \
        ("56.", 1, 0, "stop")
    assert second["messages"][1]["content"] == "Error: ZeroDivisionError: division by zero"
    assert (second["completion"], second["tool_calls"], second["tool_errors"]) == ("I cannot divide by zero.", 1, 1)
    assert "2 replies, 2 tool calls (1 failed)" in err


def test_generate_text_of_several_prompts_is_each_transcript(model_path, scripted, capsys):
    scripted += [call("1 / 0"), "No.", "Just text."]
    argv = ["generate", "--model", str(model_path), "--prompt", "a", "--prompt", "b", "--batch-size", "1", *GENERATE]
    assert main(argv) == 0
    assert capsys.readouterr().out == ('--- 0\nuser> a\nassistant> [calculator] {"expression": "1 / 0"}\n'
                                       '-> Error: ZeroDivisionError: division by zero\nNo.\n\n--- 1\nuser> b\n'
                                       'assistant> Just text.\n')


def test_chat_shows_calls_and_results_and_keeps_them_in_the_history():
    tok, model = small_tokenizer(), tiny_model(max_seq_len=2048)
    script = Script(model, tok, [call("7 * 8"), "56.", "It was 56."])
    session = ChatSession(Generator(model, tok), SamplingConfig(max_new_tokens=200, temperature=0.0),
                          runner=ToolRunner(resolve_tools("calculator")))
    out = io.StringIO()
    assert run_chat(session, io.StringIO("What is 7 * 8?\nWhat was it?\n/exit\n"), out) == 2
    shown = out.getvalue()
    assert 'you> assistant> [calculator] {"expression": "7 * 8"}\n-> 56\n56.\n' \
           "you> assistant> It was 56.\nyou> " in shown
    assert [m["role"] for m in session.messages] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert session.messages[2]["content"] == "56" and session.messages[-1]["content"] == "It was 56."
    # the second turn's prompt held the first exchange whole: the call, its result, the answer
    assert script.step == len(script.tokens)


def test_chat_command_takes_tools(model_path, scripted, capsys, monkeypatch):
    scripted += [call("2 ** 10"), "1024."]
    monkeypatch.setattr("sys.stdin", io.StringIO("2 ** 10?\n"))
    assert main(["chat", "--model", str(model_path), *GENERATE, "--max-tool-calls", "2"]) == 0
    assert '[calculator] {"expression": "2 ** 10"}\n-> 1024\n1024.\n' in capsys.readouterr().out


def test_inputs_that_cannot_work_fail_before_the_model_loads(model_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Generator, "from_checkpoint", refuse)
    model = ["--model", str(model_path), "--prompt", "x"]
    cases = [(["--tools", "calculator,nosuch"], "nosuch"),
             (["--tools", "calculator", "--max-tool-calls", "0"], "--max-tool-calls 0: expected at least 1"),
             (["--tools", "calculator", "--json-object"], "--tools does not go with a structured output flag")]
    for extra, message in cases:
        assert main(["generate", *model, *extra]) == 2
        assert message in capsys.readouterr().err


def test_a_model_without_a_chat_format_is_refused_naming_why(tmp_path, capsys):
    from tokenizer_helpers import byte_level_tokenizer

    from groundup.tokenizer import load_tokenizer

    src = tmp_path / "hf"
    src.mkdir()
    byte_level_tokenizer(["<|endoftext|>"]).save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    tok = load_tokenizer(src)
    assert tok.chat_template is None
    path = model_dir(tmp_path / "m", tiny_model(vocab_size=tok.vocab_size), tok)
    assert main(["generate", "--model", str(path), "--prompt", "x", "--tools", "calculator"]) == 2
    assert "tokenizer has no chat format" in capsys.readouterr().err
