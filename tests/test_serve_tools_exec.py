"""`serve --execute-tools`: the server runs its built-in tools in a loop and answers with the final message, through
the official `openai` client; a tool that errors is an error result and the answer still comes, every executed
call is counted in /metrics, the budget ends in a text answer, and a client's own tools keep OpenAI's contract."""

from __future__ import annotations

import json

import pytest

from groundup.tools import ToolRunner, resolve_tools
from infer_helpers import tiny_model
from serve_helpers import LiveServer, make_server, watching_logs
from tool_script import Script, one_thread  # noqa: F401 - autouse

openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


@pytest.fixture(scope="module")
def served():
    server = make_server(tiny_model(max_seq_len=2048, init_std=0.2), max_batch=2)
    server.tool_runner, server.max_tool_calls = ToolRunner(resolve_tools("calculator")), 2
    prompts = []
    encode = server.text.chat
    server.text.chat = lambda *a, **k: prompts.append(encode(*a, **k)) or prompts[-1]  # what each round was sent
    with LiveServer(server) as live:
        yield (Script(server.model, server.tokenizer), openai.OpenAI(base_url=live.url + "/v1", api_key="none",
                                                                      max_retries=0), live, prompts)


def _tool_metrics(live) -> dict[tuple[str, str], float]:
    """groundup_tool_calls_total by (tool, outcome), read by prometheus-client's own parser."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.labels["tool"], s.labels["outcome"]): s.value
            for family in text_string_to_metric_families(httpx.get(live.url + "/metrics").text)
            for s in family.samples if s.name == "groundup_tool_calls_total"}


def test_the_server_runs_the_calls_and_returns_the_final_answer(served):
    script, client, live, prompts = served
    script.reply(call("calculator", '{"expression": "7 * 8"}'), "7 * 8 = 56.")
    before = _tool_metrics(live)
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "7 * 8?"}],
                                           max_tokens=200, temperature=0)
    message = reply.choices[0].message
    assert (message.content, message.tool_calls, reply.choices[0].finish_reason) == ("7 * 8 = 56.", None, "stop")
    turns = reply.model_extra["tool_messages"]
    assert [t["role"] for t in turns] == ["assistant", "tool"]
    assert json.loads(turns[0]["tool_calls"][0]["function"]["arguments"]) == {"expression": "7 * 8"}
    assert turns[1]["content"] == "56" and turns[1]["tool_call_id"] == turns[0]["tool_calls"][0]["id"]
    tok = script.tok
    first, second = tok.decode(prompts[-2]), tok.decode(prompts[-1])
    assert '"name": "calculator"' in first and second.startswith(first)  # round two continues round one
    assert "<tool_response>56</tool_response>" in second
    rounds = [len(prompts[-2]), len(prompts[-1])]
    assert reply.usage.prompt_tokens == sum(rounds)  # usage: both rounds
    after = _tool_metrics(live)
    key = ("calculator", "ok")
    assert after[key] - before.get(key, 0.0) == 1


def test_a_tool_that_errors_is_an_error_result_and_the_answer_still_comes(served):
    script, client, live, _ = served
    before = _tool_metrics(live)
    with watching_logs() as logs:
        script.reply(call("calculator", '{"expression": "1 / 0"}'), "I cannot divide by zero.")
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1 / 0?"}],
                                               max_tokens=200, temperature=0)
        assert reply.choices[0].message.content == "I cannot divide by zero."
        assert reply.model_extra["tool_messages"][1]["content"] == "Error: ZeroDivisionError: division by zero"
        # arguments that are not JSON, and a tool no one defined: error results too, never a 500
        script.reply(call("calculator", '"{oops"') + "\n" + call("rm_rf", "{}"), "Sorry.")
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                               max_tokens=300, temperature=0)
        assert reply.choices[0].message.content == "Sorry."
        results = [t["content"] for t in reply.model_extra["tool_messages"] if t["role"] == "tool"]
        assert len(results) == 2 and all(r.startswith("Error: ") for r in results)
    assert not logs.bad
    after = _tool_metrics(live)
    errors, unknown = ("calculator", "error"), ("unknown", "error")
    assert after[errors] - before.get(errors, 0.0) == 2 and after[unknown] - before.get(unknown, 0.0) == 1


def test_past_the_budget_the_model_answers_in_text(served):
    script, client, live, prompts = served
    seven = call("calculator", '{"expression": "7"}')
    script.reply(seven, seven, seven, "Done.")  # max_tool_calls 2: two run, the third round is asked for text
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go"}],
                                           max_tokens=200, temperature=0)
    assert reply.choices[0].message.content == "Done." and reply.choices[0].finish_reason == "stop"
    assert sum(t["role"] == "tool" for t in reply.model_extra["tool_messages"]) == 2


def test_a_clients_own_tool_goes_back_to_the_client(served):
    script, client, _, _ = served
    script.reply(call("get_weather", '{"city": "Paris"}'))
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Paris?"}],
                                           tools=[WEATHER], max_tokens=200, temperature=0)
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=2)
    assert e.value.body["param"] == "n"


def test_the_command_line_refuses_user_tools_and_a_zero_budget():
    from groundup.errors import ConfigError
    from groundup.serve.commands import _tool_runner

    with pytest.raises(ConfigError, match="only built-in tools run on the server"):
        _tool_runner("calculator,os:system", 4)
    with pytest.raises(ConfigError, match="--max-tool-calls 0"):
        _tool_runner("calculator", 0)
    assert [s["function"]["name"] for s in _tool_runner("calculator,python", 4).schemas()] == ["calculator", "python"]


# SmolLM2-135M-Instruct's own chat template: ChatML that reads neither `tools` nor `tool_calls`.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_a_template_that_never_reads_tool_calls_gets_them_as_text_and_list_calls_parse(tmp_path):
    """The function-calling loop's second request (the call message, content null, then its result) renders
    with SmolLM2's template, the call written where the model wrote it; SmolLM2's list-in-one-tag calls parse."""
    from tokenizer_helpers import byte_level_tokenizer

    from groundup.serve.protocol import ChatMessage
    from groundup.serve.tokens import TokenText
    from groundup.tokenizer import load_tokenizer
    from groundup.tokenizer.tool_calls import parse_tool_calls

    byte_level_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "chat_template": SMOLLM2_TEMPLATE}))
    text = TokenText(load_tokenizer(tmp_path))
    assert not text.renders_calls
    messages = [ChatMessage(role="user", content="Paris?"),
                ChatMessage(role="assistant", content=None, tool_calls=[
                    {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]),
                ChatMessage(role="tool", tool_call_id="c1", content="18 C")]
    rendered = text.tok.decode(text.chat(messages, tools=[WEATHER]))
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>tool\n18 C<|im_end|>\n<|im_start|>assistant\n') in rendered
    content, calls = parse_tool_calls('<tool_call>[{"name": "a", "arguments": {"x": 1}}, '
                                      '{"name": "b", "arguments": {}}]</tool_call>')
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1}), ("b", {})]
    assert parse_tool_calls('<tool_call>[{"name": "a"}, 3]</tool_call>')[1] == []  # not all calls: text
