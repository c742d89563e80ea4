"""Tool calls: definitions and results through the chat template (groundup's format and a Hugging Face template
that takes `tools`, each equal to transformers' apply_chat_template), calls parsed back into OpenAI `tool_calls`
(streamed whole), tool_choice required / named constraining decoding, all through the official `openai` client,
with its documentation's function-calling loop run unchanged against a model that emits calls."""

from __future__ import annotations

import copy
import json

import pytest

from groundup.infer.structured import Structured
from groundup.serve.server import Server
from groundup.tokenizer.tool_calls import ToolCallStream, call_text, parse_tool_calls
from infer_helpers import small_tokenizer, tiny_model
from serve_helpers import LiveServer, make_server
from tool_script import Script  # the served model made to write chosen replies

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
transformers = pytest.importorskip("transformers")

# The tool of OpenAI's function-calling guide.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get current temperature for provided coordinates in celsius.",
    "parameters": {"type": "object", "properties": {"latitude": {"type": "number"}, "longitude": {"type": "number"}},
                   "required": ["latitude", "longitude"], "additionalProperties": False},
    "strict": True}}
# Arguments a random model finishes quickly: an enum and a small integer.
CLOCK = {"type": "function", "function": {
    "name": "set_alarm", "parameters": {"type": "object", "additionalProperties": False, "required": ["day", "hour"],
                                        "properties": {"day": {"enum": ["mon", "tue"]},
                                                       "hour": {"type": "integer", "minimum": 0, "maximum": 23}}}}}
LIGHTS = {"type": "function", "function": {
    "name": "lights", "parameters": {"type": "object", "additionalProperties": False, "required": ["on"],
                                     "properties": {"on": {"type": "boolean"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"latitude": 48.8566, "longitude": 2.3522}}\n</tool_call>'


def test_calls_are_read_back_whole_however_the_text_is_split():
    reply = "Let me check.\n" + CALL + "\n" + CALL.replace("48.8566", "1")
    content, calls = parse_tool_calls(reply)
    assert content == "Let me check.\n" and [c.name for c in calls] == ["get_weather"] * 2
    assert json.loads(calls[1].arguments) == {"latitude": 1, "longitude": 2.3522}
    stream, shown, seen = ToolCallStream(), "", []
    for ch in reply:  # one character at a time: no piece of a tag or of a call is ever shown as content
        shown += stream.push(ch)
        assert "<" not in shown
        seen += [json.loads(c.arguments) for c in stream.new_calls]  # every call's arguments complete JSON
    assert shown + stream.finish() == content and len(seen) == 2
    broken = "<tool_call>\n{not json}\n</tool_call> and <tool_call>\n{\"name\": \"x\""
    assert parse_tool_calls(broken) == (broken, [])  # not a call: kept as text, nothing invented
    assert call_text({"function": {"name": "get_weather", "arguments": {"latitude": 48.8566, "longitude": 2.3522}}}) \
        == CALL


CHATS = [
    [{"role": "user", "content": "Weather in Paris?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"latitude": 1, "longitude": 2}}},
         {"id": "c2", "type": "function", "function": {"name": "lights", "arguments": {"on": True}}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "14.5"}, {"role": "tool", "tool_call_id": "c2", "content": "ok"},
     {"role": "assistant", "content": "It is 14.5 C."}],
]
# A Hermes-style template that takes tools, in the shape Qwen2.5 and Hermes ship (their tags are special tokens).
HERMES_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}{%- endif %}{{- '# Tools\\n<tools>' }}{%- for tool in tools %}"
    "{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- for m in messages %}{%- if m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}{{- '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls %}{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{- (c.function.arguments | tojson) + '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role != 'system' %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def hermes_dir(tmp_path_factory):
    from tokenizer_helpers import byte_level_tokenizer

    path = tmp_path_factory.mktemp("hermes")
    byte_level_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]).save(
        str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": HERMES_TEMPLATE}))
    return path


def test_tools_and_results_render_as_transformers_renders_them(tmp_path, hermes_dir):
    from groundup.layout import TOKENIZER_FILE
    from groundup.tokenizer import load_tokenizer

    ours = small_tokenizer()
    ours.save(tmp_path)
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / TOKENIZER_FILE))
    theirs.chat_template = ours.chat_template
    hermes, hermes_theirs = load_tokenizer(hermes_dir), transformers.AutoTokenizer.from_pretrained(str(hermes_dir))
    tools = [WEATHER, LIGHTS]
    for chat in CHATS:
        for gen in (False, True):
            for tok, ref in ((ours, theirs), (hermes, hermes_theirs)):
                expected = ref.apply_chat_template(chat, tools=tools, tokenize=True, add_generation_prompt=gen,
                                                   return_dict=False)
                assert tok.render_chat(chat, add_generation_prompt=gen, tools=tools)[0] == list(expected)
    ids, mask = ours.render_chat(CHATS[1], tools=tools)
    learned = ours.decode([i for i, m in zip(ids, mask) if m])
    assert '"name": "lights", "arguments": {"on": true}' in learned and "14.5" not in learned.split("It is")[0]


@pytest.fixture(scope="module")
def scripted():
    server = make_server(copy.deepcopy(tiny_model(max_seq_len=2048, init_std=0.2)), max_batch=4)
    prompts = []
    encode = server.text.chat
    server.text.chat = lambda *a, **k: prompts.append(encode(*a, **k)) or prompts[-1]  # what the engine was sent
    with LiveServer(server) as live:
        yield Script(server.model, server.tokenizer), openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0), prompts


def test_the_openai_function_calling_loop_runs_unchanged(scripted):
    script, client, prompts = scripted
    script.reply("Let me look that up.\n" + CALL)

    # OpenAI's guide, as written there (the model name aside).
    def get_weather(latitude, longitude):
        return 14.5 if (latitude, longitude) == (48.8566, 2.3522) else None

    tools = [WEATHER]
    messages = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    completion = client.chat.completions.create(model="tiny", messages=messages, tools=tools)
    tool_call = completion.choices[0].message.tool_calls[0]
    args = json.loads(tool_call.function.arguments)
    result = get_weather(args["latitude"], args["longitude"])
    messages.append(completion.choices[0].message)  # append model's function call message
    messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": str(result)})
    script.reply("It is 14.5 C in Paris.")
    completion_2 = client.chat.completions.create(model="tiny", messages=messages, tools=tools)

    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.choices[0].message.content == "Let me look that up."
    assert tool_call.function.name == "get_weather" and tool_call.id.startswith("call_")
    assert completion_2.choices[0].message.content == "It is 14.5 C in Paris." and not completion_2.choices[0].message.tool_calls
    assert completion_2.choices[0].finish_reason == "stop"
    tok = script.tok
    first, second = tok.decode(prompts[-2]), tok.decode(prompts[-1])
    assert '"name": "get_weather"' in first and "<tool_response>14.5</tool_response>" not in first
    assert second.startswith(first)  # the call went back into the template where the model wrote it
    assert 'Let me look that up.\n' + CALL in second and "<tool_response>14.5</tool_response>" in second


def test_streamed_calls_arrive_whole(scripted):
    script, client, _ = scripted
    two = CALL + "\n" + CALL.replace("get_weather", "lights").replace(
        '{"latitude": 48.8566, "longitude": 2.3522}', '{"on": true}')
    script.reply("Checking." + two)
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Paris?"}],
                                            tools=[WEATHER, LIGHTS], stream=True)
    content, calls, reasons = "", [], []
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:  # each fragment a whole call: its arguments parse on their own
            calls.append((call.index, call.function.name, json.loads(call.function.arguments)))
        reasons.append(chunk.choices[0].finish_reason)
    assert content == "Checking." and reasons[-1] == "tool_calls"
    assert calls == [(0, "get_weather", {"latitude": 48.8566, "longitude": 2.3522}), (1, "lights", {"on": True})]
    script.reply(CALL)  # tool_choice none: the same text is the content, no calls
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Paris?"}],
                                           tools=[WEATHER], tool_choice="none")
    assert reply.choices[0].message.content == CALL and reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"


@pytest.fixture(scope="module")
def random_client():
    with LiveServer(make_server(tiny_model(max_seq_len=2048, init_std=0.2), max_batch=4)) as live:
        yield openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)


def _valid(call, tools) -> dict:
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.function.name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema)
    return args


def test_required_and_named_tool_choices_always_make_valid_calls(random_client):
    tools = [CLOCK, LIGHTS]
    messages = [{"role": "user", "content": "Wake me up."}]
    reply = random_client.chat.completions.create(model="tiny", messages=messages, tools=tools, tool_choice="required",
                                                  n=4, temperature=1.0, seed=1, max_tokens=200)
    for choice in reply.choices:  # a random model: only the grammar makes these calls
        assert choice.finish_reason in ("tool_calls", "length")
        if choice.finish_reason == "tool_calls":
            assert choice.message.tool_calls and all(_valid(c, tools) is not None for c in choice.message.tool_calls)
    assert any(c.finish_reason == "tool_calls" for c in reply.choices)
    named = {"type": "function", "function": {"name": "set_alarm"}}
    reply = random_client.chat.completions.create(model="tiny", messages=messages, tools=tools, tool_choice=named,
                                                  n=3, temperature=1.0, seed=2, max_tokens=200)
    for choice in reply.choices:
        assert choice.finish_reason == "stop" and len(choice.message.tool_calls) == 1  # OpenAI: a named call stops
        assert choice.message.tool_calls[0].function.name == "set_alarm"
        _valid(choice.message.tool_calls[0], tools)
    single = random_client.chat.completions.create(model="tiny", messages=messages, tools=tools, tool_choice="required",
                                                   parallel_tool_calls=False, n=3, temperature=1.5, seed=3)
    assert all(len(c.message.tool_calls) == 1 for c in single.choices if c.finish_reason == "tool_calls")


def test_tool_requests_that_cannot_work_are_a_400_naming_the_field(random_client):
    chat = [{"role": "user", "content": "x"}]
    cases = [(dict(tools=[CLOCK], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
             (dict(tool_choice="required"), "tool_choice"),
             (dict(tools=[CLOCK], tool_choice="sometimes"), "tool_choice"),
             (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools.0.function.name"),
             (dict(tools=[CLOCK], tool_choice="required", response_format={"type": "json_object"}), "tool_choice")]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            random_client.chat.completions.create(model="tiny", messages=chat, **kwargs)
        assert e.value.body["param"] == param, e.value.body
    bad_args = chat + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "lights", "arguments": "{on"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        random_client.chat.completions.create(model="tiny", messages=bad_args, tools=[LIGHTS])
    assert e.value.body["param"] == "messages.1.tool_calls.0.function.arguments"
    assert random_client.chat.completions.create(model="tiny", messages=chat, max_tokens=2).choices


def test_a_template_whose_tags_are_special_tokens_gets_its_calls_parsed(hermes_dir):
    """Qwen's <tool_call> is one special token: the grammar asks for it by id and the text keeps it."""
    from groundup.tokenizer import load_tokenizer

    tok = load_tokenizer(hermes_dir)
    server = Server(tiny_model(vocab_size=tok.vocab_size, max_seq_len=512, init_std=0.2), tok, name="hermes")
    assert server.text.tool_tag_ids() == tuple(tok.encode_rendered("<tool_call></tool_call>"))
    assert "<[" in Structured.tool_calls([CLOCK], tag_ids=server.text.tool_tag_ids()).spec
    with LiveServer(server) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(model="hermes", messages=[{"role": "user", "content": "Monday 7am"}],
                                               tools=[CLOCK], tool_choice="required", parallel_tool_calls=False,
                                               n=3, temperature=1.0, seed=0, max_tokens=120)
    made = [c for c in reply.choices if c.finish_reason == "tool_calls"]
    assert made and all(_valid(c.message.tool_calls[0], [CLOCK]) for c in made)
