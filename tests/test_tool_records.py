"""Tool-use records as OpenAI/TRL and ShareGPT (LLaMA-Factory) write them: read and normalised, bad ones skipped
with file:line and the reason, SFT's loss mask pinned by hand on a conversation with a call and a result (calls
learned; results and definitions never), and DPO/KTO pairs whose completions call tools."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from groundup.data.readers import ReadStats
from groundup.posttrain.pairs import read_feedback, read_pairs
from groundup.posttrain.preference import make_batch
from groundup.posttrain.records import BadRecord, iter_examples, to_example
from groundup.posttrain.sft_data import tokenize
from groundup.tokenizer import Tokenizer
from groundup.tokenizer.tool_calls import TOOLS_HEADER

EXPRESSION = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                         "parameters": EXPRESSION}}
OPENAI = {"id": "r1", "tools": [CALC], "messages": [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 12*7?"},
    {"role": "assistant", "content": "Let me compute.", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "calculator", "arguments": "{\"expression\":\"12*7\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "84"},
    {"role": "assistant", "content": "12*7 = 84."}]}


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """Bytes only (no merges): every character of ASCII text is one token, its id its byte, so the expected
    ids and mask below are written by hand."""
    return Tokenizer([bytes([b]) for b in range(256)], r"\S+|\s+")


def test_openai_tool_conversations_are_read_and_normalised(tmp_path):
    ex = to_example(OPENAI)
    assert ex.format == "messages" and ex.tools == [CALC] and ex.completion_at == 4 and "tools" not in ex.meta
    assert ex.messages == [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "What is 12*7?"},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*7"}}}]},
        {"role": "tool", "content": "84", "tool_call_id": "c1"},
        {"role": "assistant", "content": "12*7 = 84."}]
    # From Parquet, where every message gets every column (tool_calls and tool_call_id null): the same.
    pq.write_table(pa.Table.from_pylist([OPENAI]), tmp_path / "chat.parquet")
    [again] = iter_examples([tmp_path / "chat.parquet"])
    assert (again.messages, again.tools) == (ex.messages, ex.tools)
    # Content null, arguments an object, no id: the call gets call_<message>_<call>.
    bare = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "calculator", "arguments": {"expression": "1"}}}]}]}
    assert to_example(bare).messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1_0", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "1"}}}]}


def bad(**change):
    record = json.loads(json.dumps(OPENAI))
    for index, message in change.pop("messages", {}).items():
        record["messages"][index] = message
    return {**record, **change}


@pytest.mark.parametrize("record, reason", [
    (bad(messages={3: {"role": "tool", "tool_call_id": "c9", "content": "84"}}),
     "messages[3].tool_call_id = 'c9' matches no earlier tool call's id"),
    (bad(messages={2: {"role": "user", "content": "x"}, 3: {"role": "tool", "content": "84"}}),
     "messages[3]: a tool result with no tool call before it"),
    (bad(messages={2: {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{12*7"}}]}}),
     "messages[2].tool_calls[0].function.arguments: not JSON"),
    (bad(messages={2: {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "[1]"}}]}}),
     "messages[2].tool_calls[0].function.arguments: expected a JSON object, got list"),
    (bad(messages={1: {"role": "user", "content": "x", "tool_calls": OPENAI["messages"][2]["tool_calls"]}}),
     "messages[1].tool_calls: only an assistant message calls tools"),
    (bad(messages={2: {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": ""}}]}}),
     "messages[2].tool_calls[0].function.name: expected a non-empty string"),
    (bad(messages={2: {"role": "assistant", "content": None}}), "messages[2].content must be a string, got NoneType"),
    (bad(tools=[{"type": "function", "function": {"name": "f", "parameters": 3}}]),
     "tools[0].function.parameters: expected a JSON schema object"),
    (bad(tools="[{"), "'tools' is text but not JSON"),
])
def test_bad_tool_records_are_skipped_naming_the_message(tmp_path, record, reason):
    with pytest.raises(BadRecord, match="^" + re.escape(reason)):
        to_example(record)
    stats, skipped = ReadStats(), []
    path = write(tmp_path / "chat.jsonl", [OPENAI, record])
    assert [ex.id for ex in iter_examples([path], stats, skipped)] == ["r1"]
    assert stats.bad_field == 1 and skipped == [f"{path}:2: {to_reason(record)}"]


def to_reason(record) -> str:
    try:
        to_example(record)
    except BadRecord as e:
        return str(e)
    raise AssertionError("the record was accepted")


def test_sharegpt_function_call_and_observation_turns_as_llama_factory_writes_them():
    record = {"system": "Use the calculator.",
              "tools": json.dumps([CALC["function"]]),  # LLaMA-Factory: JSON text of bare definitions
              "conversations": [
                  {"from": "human", "value": "What is 12*7 and 3+4?"},
                  {"from": "function_call", "value": json.dumps([
                      {"name": "calculator", "arguments": {"expression": "12*7"}},
                      {"name": "calculator", "arguments": "{\"expression\": \"3+4\"}"}])},
                  {"from": "observation", "value": "84"},
                  {"from": "observation", "value": "7"},
                  {"from": "gpt", "value": "84 and 7."}]}
    ex = to_example(record)
    assert ex.format == "sharegpt" and ex.tools == [CALC] and "system" not in ex.meta and "tools" not in ex.meta
    call = lambda i, e: {"id": f"call_1_{i}", "type": "function",  # noqa: E731
                         "function": {"name": "calculator", "arguments": {"expression": e}}}
    assert ex.messages == [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "What is 12*7 and 3+4?"},
        {"role": "assistant", "content": None, "tool_calls": [call(0, "12*7"), call(1, "3+4")]},
        {"role": "tool", "content": "84", "tool_call_id": "call_1_0"},
        {"role": "tool", "content": "7", "tool_call_id": "call_1_1"},
        {"role": "assistant", "content": "84 and 7."}]
    with pytest.raises(BadRecord, match=r"conversations\[1\]\.value: a function call that is not JSON"):
        to_example({"conversations": [{"from": "human", "value": "x"}, {"from": "function_call", "value": "calc(1)"},
                                      {"from": "gpt", "value": "y"}]})
    with pytest.raises(BadRecord, match=r"conversations\[1\]: a tool result with no tool call before it"):
        to_example({"conversations": [{"from": "human", "value": "x"}, {"from": "observation", "value": "1"},
                                      {"from": "gpt", "value": "y"}]})


def b(text: str) -> list[int]:
    return list(text.encode())  # the bytes-only tokenizer: one id per byte


def test_sft_learns_the_assistant_s_text_and_calls_never_results_or_definitions(tok, tmp_path):
    s, t = tok.special_ids, tok.tool_ids
    bos, system, user, assistant, end = s["bos"], s["system"], s["user"], s["assistant"], s["end_of_turn"]
    call, call_end, result, result_end = (t[k] for k in ("<tool_call>", "</tool_call>", "<tool_response>",
                                                         "</tool_response>"))
    # The conversation by hand: (ids, learned) runs.
    runs = [
        ([bos, system], 0),
        (b("Use the calculator.\n\n" + TOOLS_HEADER + json.dumps(CALC)), 0),  # the definitions: never learned
        (b("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "), 0),
        ([call, call_end], 0), (b(" XML tags:\n"), 0), ([call], 0),
        (b('\n{"name": <function-name>, "arguments": <args-json-object>}\n'), 0), ([call_end], 0),
        ([end, user], 0), (b("What is 12*7?"), 0), ([end, assistant], 0),
        (b("Let me compute.\n"), 1), ([call], 1),  # the call: learned, tags and all
        (b('\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n'), 1), ([call_end, end], 1),
        ([user, result], 0), (b("84"), 0), ([result_end, end], 0),  # the result: never learned
        ([assistant], 0), (b("12*7 = 84."), 1), ([end], 1),
    ]
    ids = [i for run, _ in runs for i in run]
    mask = [learn for run, learn in runs for _ in run]
    [ex] = iter_examples([write(tmp_path / "sft.jsonl", [OPENAI])])
    tokenized = tokenize(ex, tok, "assistant")
    assert tokenized.ids == ids and tokenized.mask == mask
    assert tokenize(ex, tok, "completion").mask == [0] * (len(ids) - 11) + [1] * 11  # the last reply only
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learned == ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n'
                       '</tool_call><|end_of_turn|>12*7 = 84.<|end_of_turn|>')


PROMPT = OPENAI["messages"][:2]
CALLING = [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*7"}}}]}]
GUESSING = [{"role": "assistant", "content": "About 80."}]


def test_dpo_and_kto_take_completions_that_call_tools(tok, tmp_path):
    records = [{"tools": [CALC], "prompt": PROMPT, "chosen": CALLING, "rejected": GUESSING},
               # TRL's implicit prompt: whole conversations sharing the call and its result
               {"tools": [CALC], "chosen": OPENAI["messages"], "rejected": OPENAI["messages"][:4] + GUESSING},
               {"prompt": PROMPT, "chosen": CALLING + [{"role": "tool", "content": "84"}], "rejected": GUESSING}]
    pairs, report = read_pairs([write(tmp_path / "pairs.jsonl", records)], tok, 4096)
    assert len(pairs) == 2 and report.skipped == [f"{tmp_path / 'pairs.jsonl'}:3: the completion must be "
                                                  "non-empty assistant messages"]
    prompt = tok.render_chat(PROMPT, True, tools=[CALC])[0]
    whole = tok.render_chat(PROMPT + CALLING, tools=[CALC])[0]
    assert pairs[0].prompt == prompt and pairs[0].chosen == whole[len(prompt):]
    assert pairs[0].chosen[0] == tok.tool_ids["<tool_call>"] and pairs[0].chosen[-1] == tok.end_of_turn_id
    assert sum(i in tok.tool_ids.values() for i in prompt) == 4  # the definitions' instructions, in the prompt
    assert tok.decode(pairs[1].prompt).endswith("<tool_response>84</tool_response><|end_of_turn|><|assistant|>")
    assert pairs[1].chosen == tok.encode("12*7 = 84.") + [tok.end_of_turn_id]
    batch = make_batch(pairs[:1], "dpo", tok.pad_id, pairs)  # the call is what DPO scores
    targets = batch.targets[0][batch.targets[0] >= 0].tolist()
    assert targets == pairs[0].chosen and batch.extra[0].tolist() == [len(pairs[0].chosen), len(pairs[0].rejected)]
    singles, _ = read_feedback([write(tmp_path / "kto.jsonl", [
        {"tools": [CALC], "prompt": PROMPT, "completion": CALLING, "label": True},
        {"tools": [CALC], "prompt": PROMPT, "completion": GUESSING, "label": False}])], tok, 4096)
    assert [s.completion for s in singles] == [pairs[0].chosen, pairs[0].rejected] and singles[0].prompt == prompt
