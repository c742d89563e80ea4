"""Generative tasks of `groundup eval`: GSM8K extraction end to end and HumanEval/MBPP pass@k in the
sandbox, with a stub model whose outputs the test chooses; the engine path on a tiny model."""

from __future__ import annotations

import pytest

from groundup.eval.generation import EngineCompleter, Generated, run_generative
from groundup.eval.harness import EvalSettings, evaluate_task
from groundup.eval.metrics import pass_at_k
from groundup.sandbox.runner import default_python
from groundup.benchmarks import get_task
from infer_helpers import small_tokenizer, tiny_model


class Stub:
    """A completer returning planted outputs: `outputs(prompt, call_index)`; records what it was asked."""

    def __init__(self, outputs):
        self.outputs = outputs
        self.calls = []

    def __call__(self, prompts, *, stop, max_new_tokens, temperature, seed):
        self.calls.append({"n": len(prompts), "stop": stop, "max_new_tokens": max_new_tokens,
                           "temperature": temperature})
        return [Generated(self.outputs(p, k)) for k, p in enumerate(prompts)]


def test_gsm8k_strict_and_flexible_end_to_end():
    task = get_task("gsm8k")
    items = task.items(limit=4)
    targets = [it.target for it in items]
    planted = {
        items[0].prompt: f"She sells them all. The answer is {targets[0]}.\n\n",         # both filters
        items[1].prompt: f"Adding up we get {targets[1]} in the end",                     # flexible only
        items[2].prompt: f"The answer is {int(targets[2]) + 1}. Then again {targets[2]}",  # flexible only
        items[3].prompt: "The answer is 123456789.",                                       # neither
    }
    stub = Stub(lambda prompt, k: planted[prompt])
    out = run_generative(task, items, stub)
    m = out["metrics"]
    assert m["exact_match,strict-match"]["value"] == pytest.approx(0.25)
    assert m["exact_match,flexible-extract"]["value"] == pytest.approx(0.75)
    assert m["exact_match,strict-match"]["stderr"] == pytest.approx(0.25)  # sample std 0.5 / sqrt(4)
    assert stub.calls[0]["stop"] == ["Q:", "</s>", "<|im_end|>"] and stub.calls[0]["temperature"] == 0.0
    assert stub.calls[0]["max_new_tokens"] == 256  # lm-eval's max_gen_toks
    rec = out["records"][2]
    assert rec["strict"].rstrip(".") == str(int(targets[2]) + 1) and rec["flexible"] == targets[2]
    assert (rec["exact_match_strict"], rec["exact_match_flexible"]) == (0.0, 1.0)
    assert out["failed"] == [] and out["truncated"] == 0


HUMANEVAL_GOOD = {
    "HumanEval/0": "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
                   "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n",
}


def test_humaneval_and_mbpp_pass_at_k_with_planted_completions():
    default_python()  # an interpreter the sandbox user can run (a system python3 when the venv is private)
    he = get_task("humaneval")
    items = he.items(limit=2)
    assert items[0].entry_point == "has_close_elements"

    def humaneval(prompt, k):  # item 0: 2 of 3 samples right; item 1: none
        if prompt == items[0].prompt:
            return HUMANEVAL_GOOD["HumanEval/0"] if k % 3 != 2 else "    return None\n"
        return "    raise ValueError('no')\n"

    out = run_generative(he, items, Stub(humaneval), samples=3, ks=(1, 2, 3), sandbox_timeout=20, workers=2)
    m = out["metrics"]
    assert m["pass@1"]["value"] == pytest.approx((2 / 3 + 0) / 2)
    assert m["pass@2"]["value"] == pytest.approx((pass_at_k(3, 2, 2) + 0) / 2) == pytest.approx(0.5)
    assert m["pass@3"]["value"] == pytest.approx(0.5)
    assert out["records"][0]["passed"] == [True, True, False]
    assert out["settings"]["temperature"] == 0.8  # more than one sample: sampling

    mbpp = get_task("mbpp")
    item = mbpp.items(limit=1)[0]  # task 11: remove first and last occurrence of a character
    good = ("def remove_Occ(s,ch):\n    i = s.find(ch)\n    if i >= 0:\n        s = s[:i] + s[i + 1:]\n"
            "    j = s.rfind(ch)\n    if j >= 0:\n        s = s[:j] + s[j + 1:]\n    return s\n")
    assert "remove_Occ" in item.tests
    out = run_generative(mbpp, [item], Stub(lambda p, k: good), sandbox_timeout=20)
    assert out["metrics"]["pass@1"]["value"] == 1.0
    out = run_generative(mbpp, [item], Stub(lambda p, k: "def remove_Occ(s, ch):\n    return s\n"), sandbox_timeout=20)
    assert out["metrics"]["pass@1"]["value"] == 0.0 and out["records"][0]["status"][0].startswith("failed")


def test_failed_generation_is_counted_not_dropped():
    task = get_task("gsm8k")
    items = task.items(limit=3)

    class Failing(Stub):
        def __call__(self, prompts, **kw):
            return [Generated("", error="generation failed: boom") if p == items[1].prompt else
                    Generated("The answer is 1.") for p in prompts]

    out = run_generative(task, items, Failing(None))
    assert out["failed"] == [{"id": items[1].id, "reason": "generation failed: boom"}]
    assert len(out["records"]) == 3 and out["records"][1]["error"]


def test_engine_path_truncates_long_prompts_and_stops_at_stop_strings():
    tok = small_tokenizer()
    model = tiny_model(0, max_seq_len=96)
    task = get_task("gsm8k")  # 8-shot prompts are far longer than 96 tokens: left-truncated, counted
    r = evaluate_task(model, tok, task, EvalSettings(limit=2, max_gen_tokens=8, gen_batch_size=2), progress=False)
    assert r["items"] == 2 and r["truncated"] == 2 and "left truncation" in r["truncation"]
    assert all(len(rec["outputs"]) == 1 for rec in r["records"])

    from groundup.infer.engine import Generator

    completer = EngineCompleter(Generator(model, tok), batch_size=2)
    free = completer(["to be or not"], stop=[], max_new_tokens=12, temperature=0.0, seed=0)[0].text
    assert free
    cut = free[len(free) // 2]
    stopped = completer(["to be or not"], stop=[cut], max_new_tokens=12, temperature=0.0, seed=0)[0].text
    assert stopped == free[: free.index(cut)]  # greedy: the same text, cut before the stop string
