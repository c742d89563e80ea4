"""GRPO and RFT with tools (issue 32): a multi-turn rollout trains only on what the policy sampled (never a
tool result), its KL reference scores the same targets, a multi-turn GRPO run resumes bit-exactly, RFT
keeps the whole trajectory with the same mask, the `tests_passed` reward counts each test, and a chat
reply ending with the document-end token is penalised (the format drift)."""

from __future__ import annotations

import copy
import json
import re
import sys

import pytest
import torch

from groundup.config import load_config
from groundup.data.readers import ReadStats
from groundup.infer import Generator
from groundup.infer.engine import Completion
from groundup.infer.sampling import SamplingConfig
from groundup.loading import load_for_inference
from groundup.infer.tool_loop import ToolRollout
from groundup.model.logprobs import logprobs
from groundup.model.loss import IGNORE_INDEX
from groundup.posttrain import grpo as grpo_module
from groundup.posttrain import rft as rft_module
from groundup.posttrain import rollout as rollout_module
from groundup.posttrain.config import GRPOConfig, GRPOSection, RFTConfig
from groundup.posttrain.grpo import GRPOObjective, grpo
from groundup.posttrain.records import iter_examples
from groundup.posttrain.rft import rft
from groundup.posttrain.rollout import RolloutLoader, ends_document, penalize_malformed, read_prompts
from groundup.posttrain.sft_data import tokenize
from groundup.posttrain.tool_rollout import roll_out, tool_runner, trajectory_record
from groundup.rewards import functions as reward_fns  # imported by name, `tests_passed` would be collected
from groundup.rewards.functions import code, load_rewards, score
from infer_helpers import model_dir, small_tokenizer, tiny_model
from train_helpers import assert_resumes_exactly, metrics

PROBLEMS = [(2, 3), (4, 5), (6, 1), (7, 2)]
REWARDS = "def varied(prompt, completion, **fields):\n    return float(len(completion) % 3)\n"
# the record's own definition (short: the format's tools header alone is ~330 tokens of the tiny vocabulary)
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "",
                                           "parameters": {"type": "object",
                                                          "properties": {"expression": {"type": "string"}}}}}]


class CallsFirst(Generator):
    """The engine, except that a conversation's first assistant turn is a calculator call for the question's
    sum (with the model's own log-probs of those ids): a random tiny model never writes a well-formed call,
    and teaching one costs minutes on a shared CPU. Every later turn is sampled by the real engine, so each
    rollout is multi-turn: call, the calculator's result inserted, a sampled reply."""

    def complete_ids(self, rows, sampling=None, seeds=None, **options):
        cfg = SamplingConfig.make(sampling, **options)
        tok, out = self.tokenizer, [None] * len(rows)
        rest = [i for i, r in enumerate(rows) if tok.tool_ids["<tool_response>"] in r]
        for i, row in enumerate(rows):
            if i in rest:
                continue
            expression = re.findall(r"What is (\d+\+\d+)\?", tok.decode(row))[-1]
            body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
            ids = [tok.tool_ids["<tool_call>"], *tok.encode(f"\n{body}\n"), tok.tool_ids["</tool_call>"],
                   tok.end_of_turn_id]
            seq = torch.tensor([list(row) + ids])
            with torch.no_grad():
                lp = logprobs(self.model, seq[:, :-1], seq[:, 1:], temperature=cfg.logprob_temperature)[0, -len(ids):]
            out[i] = Completion(tok.decode(ids[:-1]), ids, "stop", len(row), lp.tolist(), None, [0.0] * len(ids))
        if rest:
            sampled = super().complete_ids([rows[i] for i in rest], cfg,
                                           seeds=None if seeds is None else [seeds[i] for i in rest])
            for i, c in zip(rest, sampled):
                out[i] = c
        return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_tools")
    model_dir(root / "base", tiny_model(max_seq_len=512), small_tokenizer())
    prompts = [{"messages": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": str(a + b), "tools": TOOLS}
               for a, b in PROBLEMS]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    (root / "tr_rewards.py").write_text(REWARDS)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


@pytest.fixture
def calls_first(monkeypatch):
    for module in (rollout_module, grpo_module, rft_module):
        monkeypatch.setattr(module, "Generator", CallsFirst)


def _rollouts(root, seed=0):
    model, tok = load_for_inference(root / "base", device="cpu")
    runner = tool_runner("calculator")
    prompts, _, bad = read_prompts([root / "prompts.jsonl"], tok, 400, runner.schemas())
    rows = [p for p in prompts for _ in range(2)]
    outs = roll_out(CallsFirst(model, tok), rows, runner, 2, seed=seed, max_new_tokens=8, temperature=1.0,
                    logprobs=True)
    assert not bad and all(o.tool_calls == 1 and o.tool_errors == 0 for o in outs)  # multi-turn: the calculator ran
    assert [o.messages[1]["content"] for o in outs] == [str(a + b) for a, b in PROBLEMS for _ in range(2)]
    return model, tok, runner, rows, outs


def test_targets_are_the_sampled_ids_and_the_reference_scores_the_same(root):
    """(a) The training tensors of multi-turn rollouts: a target exactly where the rollout's `generated`
    is True (never a tool result or an inserted turn token), the old log-probs at those places, and the
    KL reference's log-probs on the same targets (0 elsewhere)."""
    model, tok, runner, rows, outs = _rollouts(root)
    section = GRPOSection(tools="calculator", group_size=2, prompts_per_batch=4, max_new_tokens=8, beta=0.04)
    loader = RolloutLoader(rows[::2], section, load_rewards(["exact_match"]), tok, runner=runner)
    loader.bind(model, copy.deepcopy(model))
    batch = loader._tensors([o.prompt_ids for o in outs], outs, torch.zeros(len(outs)), {})
    response = tok.tool_ids["<tool_response>"]
    for i, o in enumerate(outs):
        n, span = len(o.prompt_ids), slice(len(o.prompt_ids) - 1, len(o.prompt_ids) - 1 + len(o.token_ids))
        trained = batch.targets[i, span] != IGNORE_INDEX
        assert trained.tolist() == o.generated and 0 < sum(o.generated) < len(o.generated)
        outside = torch.cat([batch.targets[i, : n - 1], batch.targets[i, span.stop :]])
        assert (outside == IGNORE_INDEX).all()
        assert batch.targets[i, span][trained].tolist() == [t for t, g in zip(o.token_ids, o.generated) if g]
        assert response in o.token_ids and response not in batch.targets[i].tolist()  # the result: never a target
        assert torch.equal(batch.old_logps[i, span][trained], torch.tensor(o.logprobs)[trained])
        assert (batch.ref_logps[i, span][~trained] == 0).all() and (batch.ref_logps[i, span][trained] != 0).all()
        # the reference is the policy here: its log-probs on the targets are those the rollout sampled with
        assert torch.allclose(batch.ref_logps[i, span][trained], batch.old_logps[i, span][trained], atol=1e-4)


def test_rft_keeps_the_trajectory_with_the_same_mask(root, tmp_path, calls_first):
    """(e) A kept rollout is the whole conversation with its tools; SFT (sft_data.tokenize) renders it as the
    ids the policy saw up to its last reply and learns on exactly the ids it sampled (the call), never on
    the result; the last reply (sampled by a random model, perhaps in another tokenization than the
    renderer's) is learned whole. Then a real RFT round with tools writes such records and fine-tunes."""
    _, tok, runner, rows, outs = _rollouts(root, seed=3)
    path = tmp_path / "kept.jsonl"
    path.write_text("".join(json.dumps(trajectory_record(p, o)) + "\n" for p, o in zip(rows, outs)))
    examples = [tokenize(ex, tok, "assistant") for ex in iter_examples([path], ReadStats())]
    assert len(examples) == len(outs)
    for o, ex in zip(outs, examples):
        last = len(o.prompt_ids) + max(k for k, g in enumerate(o.generated) if not g) + 1  # the last reply starts
        assert ex.ids[:last] == (o.prompt_ids + o.token_ids)[:last]
        assert ex.mask[:last] == [0] * len(o.prompt_ids) + [int(g) for g in o.generated[: last - len(o.prompt_ids)]]
        assert all(ex.mask[last:]) and ex.ids[-1] == tok.end_of_turn_id
    cfg = load_config(RFTConfig, None, [
        f"base={json.dumps(str(root / 'base'))}", f"rft.prompts={json.dumps([str(root / 'prompts.jsonl')])}",
        'rft.rewards=["tr_rewards:varied"]', 'rft.tools="calculator"', "rft.max_tool_calls=2", "rft.samples=2",
        "rft.max_new_tokens=8", "rft.eval_count=0", "train.max_steps=1", "train.threads=2", "log.progress=false",
        "eval.every=0", "eval.at_end=false"])
    history = rft(cfg, tmp_path / "rft")
    kept = [json.loads(line) for line in (tmp_path / "rft" / "round_01" / "samples.jsonl").read_text().splitlines()]
    assert history[0]["kept"] == len(kept) >= 1 and history[0]["sft_steps"] == 1
    for record in kept:
        assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert record["tools"] == TOOLS and record["messages"][1]["tool_calls"][0]["function"]["name"] == "calculator"
        ex = tokenize(next(iter_examples([_one(tmp_path, record)], ReadStats())), tok, "assistant")
        result = [tok.tool_ids["<tool_response>"], *tok.encode(record["messages"][2]["content"])]
        at = _find(ex.ids, result)
        assert at >= 0 and not any(ex.mask[at : at + len(result)])  # the result is never learned


def _one(tmp_path, record):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def _find(seq, sub):
    return next((i for i in range(len(seq) - len(sub) + 1) if seq[i : i + len(sub)] == sub), -1)


def _grpo_cfg(root, *extra):
    return load_config(GRPOConfig, None, [
        f"base={json.dumps(str(root / 'base'))}", f"grpo.prompts={json.dumps([str(root / 'prompts.jsonl')])}",
        'grpo.rewards=["exact_match", "tr_rewards:varied"]', 'grpo.tools="calculator"', "grpo.max_tool_calls=2",
        "grpo.group_size=2", "grpo.prompts_per_batch=2", "grpo.max_new_tokens=8", "grpo.eval_count=0",
        "train.threads=2", "log.every=1", "log.progress=false", "eval.every=0", "eval.at_end=false",
        "checkpoint.every=1", "schedule.peak_lr=1e-3", *extra])


def test_multi_turn_grpo_resumes_bit_exactly(root, tmp_path, calls_first):
    """(c) 4 steps of GRPO with the calculator (KL on, two passes per batch); a copy whose step-4 checkpoint
    is gone resumes from step 3, in the middle of a batch's passes (the multi-turn batch saved with the
    loader), and reaches bit-identical weights and the same losses."""
    extra = ["train.max_steps=4", "grpo.iterations=2", "grpo.beta=0.04"]
    summary = grpo(_grpo_cfg(root, *extra), tmp_path / "run")
    steps, _ = metrics(tmp_path / "run")
    assert summary["steps"] == 4 and all(s["tool_calls"] == 1 for s in steps)
    assert steps[0]["kl"] == pytest.approx(0, abs=1e-5)
    assert_resumes_exactly(tmp_path / "run", lambda run: grpo(_grpo_cfg(root, *extra), run, resume=True), 4)


class _EndsEitherWay:
    """A Generator whose replies are "Answer: 1" ended by the end of turn (even rows) or by the document
    end (odd rows): what a drifting policy samples. Log-probs are the model's own."""

    def __init__(self, model, tok):
        self.model, self.tok = model, tok

    def complete_ids(self, rows, **sampling):
        outs = []
        for i, row in enumerate(rows):
            ids = self.tok.encode("Answer: 1") + [self.tok.eot_id if i % 2 else self.tok.end_of_turn_id]
            seq = torch.tensor([list(row) + ids])
            with torch.no_grad():
                lp = logprobs(self.model, seq[:, :-1], seq[:, 1:])[0, -len(ids):]
            outs.append(Completion("Answer: 1", ids, "stop", len(row), lp.tolist(), None, [1.0] * len(ids)))
        return outs


def test_replies_ending_with_the_document_end_are_penalised(root, monkeypatch):
    """(d) The format drift: with a reward that cannot tell the endings apart, every group scored alike and
    nothing stopped a policy ending its chat replies with <|end_of_text|>; now such a reply scores below its
    group (advantage -0.866 against +0.866 for 2 of 4), and one step makes that ending less likely, and
    less likely than the end of turn."""
    tok, model = small_tokenizer(), tiny_model(max_seq_len=128, init_std=0.2).train()
    monkeypatch.setattr(rollout_module, "Generator", _EndsEitherWay)
    prompts, _, _ = read_prompts([root / "prompts.jsonl"], tok, 120)
    rewards = load_rewards(["exact_match"])  # 1 for every reply: "Answer: 1" ... and every answer is "1"
    for p in prompts:
        p.fields["answer"] = "1"
    batches = {}
    for penalty in (0.0, 1.0):
        section = GRPOSection(group_size=4, prompts_per_batch=2, max_new_tokens=8, malformed_penalty=penalty,
                              max_resample=2, loss_aggregation="token")
        loader = RolloutLoader(prompts, section, rewards, tok)
        loader.bind(model)
        batches[penalty] = (section, next(loader))
    assert len(batches[0.0][1].advantages) == 0  # before: nothing to learn, the drift goes on unchecked
    section, batch = batches[1.0]
    last = (batch.targets != IGNORE_INDEX).cumsum(1).argmax(1)  # the position of each reply's end token
    ends = batch.targets[torch.arange(len(last)), last]
    assert set(ends.tolist()) == {tok.eot_id, tok.end_of_turn_id} and batch.stats["malformed"] == 0.5
    expected = 0.5 / (torch.tensor([1.0, 1, 0, 0]).std() + 1e-4)
    assert torch.allclose(batch.advantages, torch.where(ends == tok.eot_id, -expected, expected))
    row = int((ends == tok.eot_id).nonzero()[0])

    def p_end():
        with torch.no_grad():
            probs = torch.softmax(model(batch.inputs[row : row + 1]).logits[0, last[row]], -1)
        return float(probs[tok.eot_id]), float(probs[tok.end_of_turn_id])

    before = p_end()
    out = GRPOObjective(section, rewards=rewards, tokenizer=tok)(model, batch, "cpu")
    out.loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    after = p_end()
    assert after[0] < before[0] / 2 and after[1] / after[0] > 2 * before[1] / before[0]  # the end of turn wins


def test_penalty_and_ending_rules():
    tok = small_tokenizer()
    chat = rollout_module.Prompt([1], "q", {}, [{"role": "user", "content": "q"}])
    text = rollout_module.Prompt([1], "q", {}, None)
    eos, eot = tok.eot_id, tok.end_of_turn_id
    mid = ToolRollout([1], [5, eos, 9, 9, 6, eot], [True, True, False, False, True, True])
    inserted = ToolRollout([1], [5, eot, eos, 6, eot], [True, True, False, True, True])
    assert ends_document(chat, mid, tok)  # a tool turn that ended with the document end is malformed too
    assert not ends_document(chat, inserted, tok)  # an inserted id is not the policy's ending
    assert not ends_document(text, Completion("", [5, eos], "stop", 1), tok)  # a text ends at the document end
    assert penalize_malformed([0.5, 2.0, 1.0, 3.0, 1.0, 1.0], [False, True, False, False, False, True], 3, 1.0) == \
        [0.5, -0.5, 1.0, 3.0, 1.0, 0.0]
    assert penalize_malformed([1.0, 2.0], [True, False], 2, 0.0) == [1.0, 2.0]


def test_tests_passed_counts_each_test():
    """(b) The share of a record's tests that pass, run in the sandbox: 3 of 4 asserts -> 0.75 (the `code`
    reward stays all or nothing: 0); HumanEval's check(candidate) and a chat reply's fenced code too."""
    tests = "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(2, 2) == 5\nassert add(-1, 1) == 0\n"
    right = "    return a + b\n"
    assert reward_fns.tests_passed("def add(a, b):\n", right, tests=tests) == 0.75
    assert code("def add(a, b):\n", right, tests=tests) == 0.0
    total, parts, error = score(load_rewards(["tests_passed", "code"]), "def add(a, b):\n", right, {"tests": tests})
    assert parts == {"tests_passed": 0.75, "code": 0.0} and error is None
    reply = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    assert reward_fns.tests_passed("Write add(a, b).", reply, tests=tests.splitlines()) == 0.75  # MBPP's test_list
    check = ("def check(candidate):\n    assert candidate(1, 2) == 3\n    x = 4\n    assert candidate(x, 0) == 4\n"
             "    for i in range(3):\n        assert candidate(i, i) == 2 * i + 1\n")
    assert reward_fns.tests_passed("def add(a, b):\n", right, tests=check, entry_point="add") == pytest.approx(2 / 3)
    assert reward_fns.tests_passed("def add(a, b):\n", "    return 1 / 0\n", tests=tests) == 0.0
    assert reward_fns.tests_passed("def add(a, b):\n", right, tests="") == 0.0


def test_a_tool_use_chat_record_is_a_prompt_up_to_its_user_message(tmp_path):
    """`data sample --chat --tools` records serve as GRPO prompts: the reply to the last user message (calls,
    results, the answer) is what the policy writes, so the prompt ends with that user message."""
    from groundup.corpus.tool_chats import TOOLS

    record = {"tools": TOOLS, "answer": "77", "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 11 * 7?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "calculator", "arguments": "{\"expression\": \"11 * 7\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "77"},
        {"role": "assistant", "content": "11 * 7 = 77.\nAnswer: 77"}]}
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(record) + "\n")
    tok = small_tokenizer()
    prompts, _, bad = rollout_module.read_prompts([path], tok, 4096, tools=TOOLS)
    assert bad == [] and len(prompts) == 1
    assert [m["role"] for m in prompts[0].messages] == ["system", "user"] and prompts[0].text == "What is 11 * 7?"
    expected, _ = tok.render_chat(record["messages"][:2], add_generation_prompt=True, tools=TOOLS)
    assert prompts[0].ids == expected and prompts[0].fields["answer"] == "77"
