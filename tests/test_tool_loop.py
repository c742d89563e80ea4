"""Generation that runs tools (infer/tool_loop.py), through the real engine and a tiny model.

The model's sampler is steered where a test needs a given reply: `Scripted` replaces the engine's per-sequence
Sampler and writes the reply the test planned for that conversation and round, as the chat renderer
tokenizes it, one token per engine step; a round planned as None samples freely from the model (seeded).
Everything else is the real path: the engine batches the rows, the model computes every logit (log-probs
come from it), the tokenizer renders prompts and continuations, the runner runs the tools.
"""

from __future__ import annotations

import json

import pytest
import torch

import groundup.infer.core as core_module
from groundup.errors import ConfigError
from groundup.infer import Generator, generate_with_tools
from groundup.infer.sampling import Sampler
from groundup.tokenizer import load_tokenizer
from groundup.tools import Tool, ToolRunner, resolve_tools
from infer_helpers import small_tokenizer, tiny_model



def _boom():
    raise RuntimeError("the disk is on fire")


BOOM = Tool("boom", "always fails", {"type": "object", "properties": {}, "required": []}, _boom)
LONG = Tool("long", "a long answer", {"type": "object", "properties": {}, "required": []}, lambda: "word " * 300)
N = Tool("n", "a number", {"type": "object", "properties": {}, "required": []}, lambda: 42)


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def reply_ids(tok, message: dict) -> list[int]:
    """The ids the chat renderer writes for an assistant message after the generation prompt, through its
    end-of-turn token (what a model that writes exactly this reply samples)."""
    user = [{"role": "user", "content": "-"}]
    before = tok.render_chat(user, add_generation_prompt=True)[0]
    ids = tok.render_chat([*user, message])[0]
    assert ids[: len(before)] == before
    reply = ids[len(before):]
    return reply[: reply.index(tok.end_of_turn_id) + 1]


class Scripted(Sampler):
    """The engine's sampler, steered: `plan[question][round]` is the reply to write (None: sample)."""

    plan: dict[str, list[dict | list[int] | None]] = {}
    tok = None
    user, assistant = "<|user|>", "<|assistant|>"  # how the chat format opens those turns (groundup's)

    def __init__(self, cfg, prompts, vocab_size, device):
        super().__init__(cfg, prompts, vocab_size, device)
        text = self.tok.decode(prompts[0])
        question = next(q for q in self.plan if f"{self.user}{q}" in text)
        round_ = text.count(self.assistant) - 1  # the turns already written, before the generation prompt
        message = self.plan[question][round_]  # a message, ids to write as they are, or None
        self.forced = message if message is None or isinstance(message, list) else reply_ids(self.tok, message)
        self.step = 0

    def __call__(self, logits):
        if self.forced is None:
            return super().__call__(logits)
        token = self.forced[min(self.step, len(self.forced) - 1)]
        self.step += 1
        return torch.tensor([token], device=logits.device)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Decode steps of a tiny model are too small to share: on a busy machine two threads wait on each other
    (15-30x slower than one, measured), so this file runs on one and gives the count back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def gen():
    return Generator(tiny_model(max_seq_len=1024, init_std=0.2), small_tokenizer())


@pytest.fixture
def script(monkeypatch):
    monkeypatch.setattr(core_module, "Sampler", Scripted)
    monkeypatch.setattr(Scripted, "tok", small_tokenizer())
    return Scripted


def last_turn(r) -> list[int]:
    """The ids sampled after the last inserted id."""
    last = max(k for k, g in enumerate(r.generated) if not g)
    assert all(r.generated[last + 1:])
    return r.token_ids[last + 1:]


def full_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) from one forward over the whole sequence (the definition)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_rollouts_are_the_rendered_conversation_with_the_sampled_ids_marked(gen, script):
    tok = gen.tokenizer
    script.plan = {
        "What is 37 * 91?": [{"role": "assistant", "content": "Let me compute.",
                              "tool_calls": [call("calculator", expression="37 * 91")]},
                             {"role": "assistant", "content": "It is 3367."}],
        "Say hi": [{"role": "assistant", "content": "hi"}],
        "Break it": [{"role": "assistant", "content": "", "tool_calls": [call("boom")]},
                     {"role": "assistant", "content": "The tool failed."}],
    }
    runner = ToolRunner([*resolve_tools("calculator"), BOOM])
    conversations = [[{"role": "user", "content": q}] for q in script.plan]
    events = []
    rollouts = generate_with_tools(gen, conversations, runner, seed=5, max_new_tokens=64, temperature=1.0,
                                   logprobs=True, on_event=lambda *event: events.append(event))
    math_, hi, broken = rollouts
    for conversation, r in zip(conversations, rollouts):
        ids, mask = tok.render_chat(conversation + r.messages, tools=runner.schemas())
        assert r.prompt_ids + r.token_ids == ids  # the whole sequence, as the chat renderer renders it
        assert r.prompt_ids == tok.render_chat(conversation, add_generation_prompt=True, tools=runner.schemas())[0]
        assert r.generated == [bool(m) for m in mask[len(r.prompt_ids):]]  # sampled = the SFT loss mask
        assert len(r.logprobs) == len(r.token_ids) and r.finish_reason == "stop"
        reference = full_logprobs(gen.model, ids)[len(r.prompt_ids) - 1:]
        for k, (lp, sampled) in enumerate(zip(r.logprobs, r.generated)):
            assert lp == 0.0 if not sampled else lp == pytest.approx(reference[k].item(), abs=1e-4)
    assert math_.messages == [
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "calculator", "arguments": '{"expression": "37 * 91"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "3367"},
        {"role": "assistant", "content": "It is 3367."}]
    assert (math_.text, math_.tool_calls, math_.tool_errors) == ("It is 3367.", 1, 0)
    assert (hi.messages, hi.text, hi.tool_calls) == ([{"role": "assistant", "content": "hi"}], "hi", 0)
    assert broken.messages[1]["content"] == "Error: RuntimeError: the disk is on fire"
    assert (broken.tool_calls, broken.tool_errors, broken.text) == (1, 1, "The tool failed.")
    inserted = tok.decode([t for t, g in zip(broken.token_ids, broken.generated) if not g])
    assert "<tool_response>Error: RuntimeError: the disk is on fire</tool_response>" in inserted  # the model read it
    kinds = [(row, kind) for row, kind, _ in events]  # round by round: the replies, their calls, the results
    assert kinds == [(0, "text"), (1, "text"), (0, "call"), (2, "call"), (0, "result"), (2, "result"),
                     (0, "text"), (2, "text")]
    assert [events[k][2].name for k in (2, 3)] == ["calculator", "boom"]
    assert events[4][2].content == "3367" and not events[5][2].ok and events[-1][2] == "The tool failed."


def test_max_tool_calls_is_respected_then_one_last_turn(gen, script):
    one = {"role": "assistant", "content": "", "tool_calls": [call("n")]}
    two = {"role": "assistant", "content": "", "tool_calls": [call("n"), call("n")]}
    script.plan = {"Count": [one, two, one, one]}
    runner = ToolRunner([N])
    [r] = generate_with_tools(gen, [[{"role": "user", "content": "Count"}]], runner, max_tool_calls=2,
                              max_new_tokens=80, temperature=1.0)
    assert [m["role"] for m in r.messages] == ["assistant", "tool", "assistant", "tool", "tool", "assistant"]
    assert [m["content"] for m in r.messages if m["role"] == "tool"] == [
        "42", "42", "Error: not run: this conversation has used all 2 of its tool calls; answer with what you have"]
    assert (r.tool_calls, r.tool_errors, r.finish_reason) == (2, 1, "tool_calls")
    assert [c["id"] for m in r.messages if m["role"] == "assistant" for c in m["tool_calls"]] == \
        ["call_0", "call_1", "call_2", "call_3"]
    sampled = [len(reply_ids(gen.tokenizer, m)) for m in (one, two, one)]
    assert sum(r.generated) == sum(sampled)  # three turns sampled, no fourth
    [none] = generate_with_tools(gen, [[{"role": "user", "content": "Count"}]], runner, max_tool_calls=0,
                                 max_new_tokens=80, temperature=1.0)
    assert (len(none.messages), none.tool_calls, none.finish_reason) == (1, 0, "tool_calls")


def test_a_reply_that_ends_at_end_of_text_is_not_continued(gen, script):
    tok = gen.tokenizer
    one = {"role": "assistant", "content": "", "tool_calls": [call("n")]}
    drifted = reply_ids(tok, one)[:-1] + [tok.eot_id]  # the call, then the document's end, not the turn's
    script.plan = {"Drift": [drifted, one]}
    shown = [{"type": "function", "function": {"name": "n", "description": "a record's own definition"}}]
    [r] = generate_with_tools(gen, [[{"role": "user", "content": "Drift"}]], ToolRunner([N]), max_new_tokens=40,
                              temperature=1.0, tools=shown)
    assert r.prompt_ids == tok.render_chat([{"role": "user", "content": "Drift"}], True, tools=shown)[0]
    assert (r.token_ids, r.finish_reason, r.tool_calls) == (drifted, "stop", 0) and all(r.generated)
    assert r.messages == [{**one, "tool_calls": [{"id": "call_0", **call("n")}]}]


def test_max_tool_calls_must_be_a_count(gen):
    with pytest.raises(ConfigError, match="max_tool_calls = -1: expected an integer >= 0"):
        generate_with_tools(gen, [[{"role": "user", "content": "x"}]], ToolRunner([N]), max_tool_calls=-1)


def test_a_full_context_ends_the_row_with_length_never_an_error(script):
    tok = small_tokenizer()
    runner = ToolRunner([LONG])
    prompt = len(tok.render_chat([{"role": "user", "content": "Long"}], add_generation_prompt=True,
                                 tools=runner.schemas())[0])
    asks = {"role": "assistant", "content": "", "tool_calls": [call("long")]}
    script.plan = {"Long": [asks, {"role": "assistant", "content": "ok"}]}
    small = Generator(tiny_model(max_seq_len=prompt + 50, init_std=0.2), tok)
    [r] = generate_with_tools(small, [[{"role": "user", "content": "Long"}]], runner, max_new_tokens=40,
                              temperature=1.0)
    # The call fits, its 300-word result does not: the results are not appended, the call message is last.
    assert (r.finish_reason, r.tool_calls, r.messages) == ("length", 1, [{**asks, "tool_calls": [
        {"id": "call_0", **call("long")}]}])
    assert r.prompt_ids + r.token_ids == tok.render_chat([{"role": "user", "content": "Long"}, *r.messages],
                                                        tools=runner.schemas())[0]
    assert all(r.generated) and len(r.token_ids) == len(reply_ids(tok, asks))
    tiny_ctx = Generator(tiny_model(max_seq_len=prompt, init_std=0.2), tok)
    [full] = generate_with_tools(tiny_ctx, [[{"role": "user", "content": "Long"}]], runner, max_new_tokens=8)
    assert (full.finish_reason, full.token_ids, full.messages) == ("length", [], [])
    cut = Generator(tiny_model(max_seq_len=prompt + 3, init_std=0.2), tok)
    [cut_r] = generate_with_tools(cut, [[{"role": "user", "content": "Long"}]], runner, max_new_tokens=30)
    assert (cut_r.finish_reason, len(cut_r.token_ids), cut_r.tool_calls) == ("length", 3, 0)


def test_each_row_samples_with_its_own_seeds_in_a_batch_or_alone_and_reruns_exactly(gen, script):
    asks = {"role": "assistant", "content": "", "tool_calls": [call("n")]}
    script.plan = {"Number": [asks, None], "Chat": [None]}  # after the result: free sampling, seeded
    runner = ToolRunner([N])
    conversations = [[{"role": "user", "content": q}] for q in ("Number", "Chat", "Number", "Number")]
    options = dict(max_new_tokens=34, temperature=1.0, logprobs=True)
    # Each call in a fresh engine: its prefix cache starts empty, as in a resumed run and after every weight
    # update (cached K/V is computed in other shapes, so it may round differently from a fresh prefill).
    def fresh():
        return Generator(gen.model, gen.tokenizer)

    batch = generate_with_tools(fresh(), conversations, runner, seed=3, **options)
    assert generate_with_tools(fresh(), conversations, runner, seed=3, **options) == batch  # bit-exact
    for i in (1, 2):  # alone, row i is row 0 of a call seeded seed + i: the same rollout (in round 1 of the
        # batch, row 2 is the second row still running: its seed is still its own)
        [alone] = generate_with_tools(fresh(), [conversations[i]], runner, seed=3 + i, **options)
        assert (alone.token_ids, alone.generated, alone.messages) == (batch[i].token_ids, batch[i].generated,
                                                                     batch[i].messages)
        assert alone.logprobs == pytest.approx(batch[i].logprobs, abs=1e-5)  # batched matmuls may round apart
    free = [last_turn(r) for r in (batch[0], batch[2], batch[3])]
    assert all(free) and len({tuple(f) for f in free}) == 3  # one conversation, three seeds, three answers
    assert all(r.tool_calls == 1 and r.messages[1]["content"] == "42" for r in (batch[0], batch[2], batch[3]))


# A ChatML template with tools in the shape Qwen2.5 ships: calls after the content, results in a user turn, and
# a newline after each <|im_end|> that the model never samples (it stops at <|im_end|>).
CHATML = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
    "{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls or [] %}{{- ('\\n' if m.content or not loop.first else '') }}"
    "{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + c.function.arguments }}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    from tokenizer_helpers import byte_level_tokenizer

    path = tmp_path_factory.mktemp("chatml")
    byte_level_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                          "<tool_response>", "</tool_response>"]).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHATML}))
    return load_tokenizer(path)


def test_a_hugging_face_template_continues_where_the_model_stopped(chatml, script, monkeypatch):
    tok = chatml
    monkeypatch.setattr(Scripted, "tok", tok)
    monkeypatch.setattr(Scripted, "user", "<|im_start|>user\n")
    monkeypatch.setattr(Scripted, "assistant", "<|im_start|>assistant")
    asks = {"role": "assistant", "content": "Sure.", "tool_calls": [call("calculator", expression="6*7")]}
    answer = {"role": "assistant", "content": "42."}
    script.plan = {"Six times seven?": [asks, answer]}
    runner = ToolRunner(resolve_tools("calculator"))
    conversation = [{"role": "user", "content": "Six times seven?"}]
    chat_gen = Generator(tiny_model(vocab_size=tok.vocab_size, max_seq_len=1024, init_std=0.2), tok)
    [r] = generate_with_tools(chat_gen, [conversation], runner, max_new_tokens=60, temperature=1.0)
    assert r.messages[1]["content"] == "42" and (r.text, r.tool_calls, r.finish_reason) == ("42.", 1, "stop")
    whole = tok.render_chat(conversation + r.messages, tools=runner.schemas())[0]
    ours = r.prompt_ids + r.token_ids
    # The template's own rendering, but for the newline after the last <|im_end|>: the model stopped before it.
    assert whole[: len(ours)] == ours and tok.decode(whole[len(ours):]) == "\n"
    sampled = [t for t, g in zip(r.token_ids, r.generated) if g]
    assert sampled == reply_ids(tok, asks) + reply_ids(tok, answer)
    inserted = tok.decode([t for t, g in zip(r.token_ids, r.generated) if not g])
    assert inserted == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
