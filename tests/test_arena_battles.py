"""`groundup arena` battles: tiny in-process contestants, a scripted judge behind a fake OpenAI endpoint; the
swap, unparsable verdicts, resume after a kill (no order judged twice), settings, the samplers."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from groundup.arena.battle_plan import Prompt, active_round, model_pairs, read_prompts, uniform_plan
from groundup.arena.battles import BattleConfig, combined_battles, run_battles
from groundup.errors import ConfigError
from groundup.infer.engine import Generator
from infer_helpers import model_dir, tiny_model
from judge_helpers import FakeOpenAI, judged_user_text

pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [{"question_id": "q1", "category": "math", "prompt": "What is 2+3?"},
           {"question_id": "q2", "category": "chat", "messages": [{"role": "user", "content": "Name a colour."}]},
           "this line is not JSON",
           {"question_id": "q3", "category": "math", "prompt": "What is 7*6?"},
           {"question_id": "q4", "category": "chat", "prompt": "Say hello."}]


def write_prompts(path: Path) -> Path:
    path.write_text("\n".join(p if isinstance(p, str) else json.dumps(p) for p in PROMPTS) + "\n")
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"alice": str(model_dir(root / "alice", tiny_model(seed=1))),
            "bob": str(model_dir(root / "bob", tiny_model(seed=2)))}


def rows(out: Path, name: str = "battles.jsonl") -> list[dict]:
    path = out / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def hashed_verdict(body: dict) -> str:
    """A deterministic judge: the verdict follows a hash of what it is shown."""
    pick = hashlib.sha256(judged_user_text(body).encode()).digest()[0] % 4
    return "Reasons.\n" + ["[[A]]", "[[B]]", "[[C]]", "[[D]]"][pick]


def test_a_judge_that_always_picks_a_gives_ties_and_full_inconsistency(tmp_path, models, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-on-disk")
    cfg = BattleConfig(battles_per_pair=4, max_tokens=6, temperature=0.8, seed=3, batch_size=3)
    with FakeOpenAI(lambda body: "A reads better.\n[[A]]") as judge:
        log = run_battles(models, write_prompts(tmp_path / "p.jsonl"), judge.url + "#judge", tmp_path / "out", cfg,
                          progress=False)
        assert len(judge.chats()) == 8  # 4 battles x 2 orders, nothing more
    got = rows(tmp_path / "out")
    assert log == tmp_path / "out" / "battles.jsonl" and len(got) == 8
    assert Counter((r["battle_id"], r["swap"]) for r in got) == Counter(
        {(f"alice-vs-bob-{k}", s): 1 for k in range(4) for s in (False, True)})
    assert {(r["swap"], r["winner"]) for r in got} == {(False, "model_a"), (True, "model_b")}
    assert all(r["judge"] == judge.url + "#judge" and r["attempts"] == 1 and r["verdict_raw"].endswith("[[A]]")
               for r in got)
    combined = combined_battles(got)
    assert [c["winner"] for c in combined] == ["tie"] * 4 and not any(c["consistent"] for c in combined)
    summary = json.loads((tmp_path / "out" / "judging.json").read_text())
    assert {k: summary[k] for k in ("battles_planned", "orders_judged", "unparsable", "consistent", "inconsistent",
                                    "malformed_replies", "prompts_skipped", "torn_lines")} == {
        "battles_planned": 4, "orders_judged": 8, "unparsable": 0, "consistent": 0, "inconsistent": 4,
        "malformed_replies": 0, "prompts_skipped": 1, "torn_lines": 0}
    assert "p.jsonl:3: not JSON" in summary["prompts_skipped_examples"][0]
    # each model answered each prompt once, seeded seed + the prompt's index, as the engine answers alone
    answers = rows(tmp_path / "out", "answers.jsonl")
    assert Counter((a["model"], a["question_id"]) for a in answers).most_common(1)[0][1] == 1
    prompts, _ = read_prompts(tmp_path / "p.jsonl")
    gen = Generator.from_checkpoint(models["alice"])
    for a in (a for a in answers if a["model"] == "alice"):
        p = next(p for p in prompts if p.question_id == a["question_id"])
        assert a["answer"] == "".join(gen.chat(p.messages, max_new_tokens=6, temperature=0.8, seed=3 + p.index))
    by_key = {(a["model"], a["question_id"]): a["answer"] for a in answers}
    for r in got:  # answer_a is model_a's answer in both orders; the judge saw it second when swapped
        assert (r["answer_a"], r["answer_b"]) == (by_key[(r["model_a"], r["question_id"])],
                                                  by_key[(r["model_b"], r["question_id"])])
    for path in (tmp_path / "out").iterdir():
        assert "sk-never-on-disk" not in path.read_text()


def test_malformed_verdicts_are_retried_then_logged_apart(tmp_path, models):
    def reply(body):  # the math prompts get a verdict on the retry, the chat prompts never
        if body["messages"][-1]["content"].startswith("Your answer did not end"):
            return "[[B]]" if "What is" in judged_user_text(body) else "still no verdict"
        return "I cannot decide."

    cfg = BattleConfig(battles_per_pair=4, max_tokens=4, judge_retries=1)
    with FakeOpenAI(reply) as judge:
        run_battles(models, write_prompts(tmp_path / "p.jsonl"), judge.url, tmp_path / "out", cfg, progress=False)
        first = len(judge.chats())
        run_battles(models, tmp_path / "p.jsonl", judge.url, tmp_path / "out", cfg, progress=False)
        assert len(judge.chats()) == first == 16  # 8 orders x 2 asks; the rerun asks nothing
    good, bad = rows(tmp_path / "out"), rows(tmp_path / "out", "unparsable.jsonl")
    assert all(r["attempts"] == 2 and r["winner"] is None and r["error"] for r in bad)
    assert all(r["attempts"] == 2 and r["verdict_raw"] == "[[B]]" for r in good)
    assert {r["prompt"].startswith("What is") for r in good} == {True}
    assert len(good) + len(bad) == 8 and len(bad) == 2 * sum(r["question_id"] in ("q2", "q4") for r in good + bad) / 2
    summary = json.loads((tmp_path / "out" / "judging.json").read_text())
    assert (summary["unparsable"], summary["orders_judged"]) == (len(bad), len(good))
    assert summary["malformed_replies"] == len(good) + 2 * len(bad)


CHILD = """
import json, sys
from pathlib import Path
from groundup.arena.battles import BattleConfig, run_battles
models, prompts, judge, out, cfg = json.loads(sys.argv[1])
run_battles(models, Path(prompts), judge, Path(out), BattleConfig(**cfg), progress=False)
"""


def test_resume_after_a_kill_judges_no_order_twice(tmp_path, models):
    prompts = write_prompts(tmp_path / "p.jsonl")
    cfg = {"battles_per_pair": 4, "max_tokens": 4, "batch_size": 1, "concurrency": 1}
    child: list[subprocess.Popen] = []

    def reply(body):  # the 5th judge request kills the arena mid-battle (orders 0-3 are on disk)
        if len(judge.chats()) == 5:
            os.kill(child[0].pid, signal.SIGKILL)
            time.sleep(0.5)
        return hashed_verdict(body)

    with FakeOpenAI(reply) as judge:
        args = json.dumps([models, str(prompts), judge.url, str(tmp_path / "out"), cfg])
        child.append(subprocess.Popen([sys.executable, "-c", CHILD, args], cwd=ROOT))
        assert child[0].wait(timeout=120) == -signal.SIGKILL
        before = rows(tmp_path / "out")
        assert [(r["battle_id"], r["swap"]) for r in before] == [(f"alice-vs-bob-{k}", s) for k in (0, 1)
                                                                 for s in (False, True)]
        asked = len(judge.chats())
        run_battles(models, prompts, judge.url, tmp_path / "out", BattleConfig(**cfg), progress=False)
        assert len(judge.chats()) - asked == 8 - 4  # only the orders not on disk
    with FakeOpenAI(hashed_verdict) as judge:  # the same arena, never killed
        run_battles(models, prompts, judge.url, tmp_path / "clean", BattleConfig(**cfg), progress=False)
    strip = lambda rs: sorted(json.dumps({k: v for k, v in r.items() if k not in ("tstamp", "judge")},
                                         sort_keys=True) for r in rs)
    assert strip(rows(tmp_path / "out")) == strip(rows(tmp_path / "clean"))
    answers = rows(tmp_path / "out", "answers.jsonl")
    assert len(answers) == len({(a["model"], a["question_id"]) for a in answers})


def test_torn_line_settings_and_a_growing_budget(tmp_path, models):
    prompts = write_prompts(tmp_path / "p.jsonl")
    cfg = BattleConfig(battles_per_pair=2, max_tokens=4)
    out = tmp_path / "out"
    with FakeOpenAI(hashed_verdict) as judge:
        run_battles(models, prompts, judge.url, out, cfg, progress=False)
        data = (out / "battles.jsonl").read_bytes()
        lines = data.splitlines(keepends=True)
        (out / "battles.jsonl").write_bytes(b"".join(lines[:1]) + b'{"battle_id": 5}\nnot json\n'
                                            + b"".join(lines[1:])[:-20])  # two bad lines; a kill in the last
        run_battles(models, prompts, judge.url, out, cfg, progress=False)
        assert len(judge.chats()) == 4 + 1  # the torn order again, nothing else
        summary = json.loads((out / "judging.json").read_text())
        assert (summary["torn_lines"], summary["bad_lines"], summary["orders_judged"]) == (1, 2, 4)
        assert [e.split("battles.jsonl:")[1][:24] for e in summary["bad_line_examples"]] == [
            "2: a row needs battle_id", "3: not JSON (Expecting v"]
        with pytest.raises(ConfigError, match="temperature = 0.5: expected 0.0"):
            run_battles(models, prompts, judge.url, out, BattleConfig(battles_per_pair=2, max_tokens=4,
                                                                      temperature=0.5), progress=False)
        with pytest.raises(ConfigError, match="judge = "):
            run_battles(models, prompts, judge.url + "#other", out, cfg, progress=False)
        with pytest.raises(ConfigError, match="battles_per_pair = 1: expected a budget of at least the 2 battles"):
            run_battles(models, prompts, judge.url, out, BattleConfig(battles_per_pair=1, max_tokens=4), progress=False)
        run_battles(models, prompts, judge.url, out, BattleConfig(battles_per_pair=3, max_tokens=4), progress=False)
        assert len(judge.chats()) == 5 + 2  # the third battle's two orders
    judged = [json.loads(line) for line in (out / "battles.jsonl").read_text().splitlines() if '"swap"' in line]
    assert len(judged) == 6 == len({(r["battle_id"], r["swap"]) for r in judged})  # the 2 bad lines stay, skipped
    assert len(rows(out, "plan.jsonl")) == 3


def test_samplers_plan_the_budget():
    prompts = [Prompt(i, f"q{i}", "general", [{"role": "user", "content": str(i)}]) for i in range(3)]
    pairs = model_pairs(["c", "a", "b"])
    assert pairs == [("a", "b"), ("a", "c"), ("b", "c")]
    plan = uniform_plan(pairs, prompts, 5, seed=0, planned={})
    assert Counter(tuple(sorted((b.model_a, b.model_b))) for b in plan) == {("a", "b"): 2, ("a", "c"): 2, ("b", "c"): 1}
    ab = [b.question_id for b in uniform_plan(pairs[:1], prompts, 6, seed=0, planned={})]
    assert sorted(ab[:3]) == ["q0", "q1", "q2"] and ab[3:] == ab[:3]  # a pair's battles cycle through the prompts
    more = uniform_plan(pairs, prompts, 8, seed=0, planned={("a", "b"): 2, ("a", "c"): 2, ("b", "c"): 1})
    assert [b.battle_id for b in more] == ["a-vs-b-2", "a-vs-c-2", "b-vs-c-1"]  # a larger budget adds battles
    # a beats b and c every time; b against c is even: the active sampler spends the round on b-vs-c
    score = {("a", "b"): (10.0, 10), ("a", "c"): (10.0, 10), ("b", "c"): (5.0, 10)}
    round_ = active_round(pairs, prompts, 3, seed=0, round=4, planned={p: 10 for p in pairs}, score=score)
    assert [b.battle_id for b in round_] == ["b-vs-c-10", "b-vs-c-11", "b-vs-c-12"] and round_[0].round == 4


def test_active_arena_favours_the_close_pair(tmp_path):
    def reply(body):
        if body["model"] != "judge":  # contestants: "strong" answers well, the two weak ones alike
            return "a careful answer" if body["model"] == "strong" else "meh"
        text = judged_user_text(body)
        a = text.split("[The start of reply A]")[1]
        return "[[A]]" if a.lstrip().startswith("a careful") else "[[B]]" if "a careful" in text else "[[C]]"

    with FakeOpenAI(reply, ["judge"]) as server:
        models = {m: f"{server.url}#{m}" for m in ("strong", "weak", "weak2")}
        cfg = BattleConfig(battles_per_pair=0, battles=15, sampler="active", max_tokens=8)
        run_battles(models, write_prompts(tmp_path / "p.jsonl"), server.url + "#judge", tmp_path / "out", cfg,
                    progress=False)
    got = rows(tmp_path / "out")
    per_pair = Counter(tuple(sorted((r["model_a"], r["model_b"]))) for r in got if not r["swap"])
    assert sum(per_pair.values()) == 15 and per_pair[("weak", "weak2")] > max(per_pair[("strong", "weak")],
                                                                              per_pair[("strong", "weak2")])
    assert all(c["consistent"] for c in combined_battles(got))


def test_a_small_in_process_judge_held_to_the_verdict_alone_always_parses(tmp_path, models):
    """judge_verdict_only: the judge's decoding is constrained to [[A]]..[[D]], so an untrained model judges
    every order (free, the same model writes no verdict at all)."""
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    cfg = BattleConfig(battles_per_pair=4, max_tokens=8, judge_max_tokens=16, judge_verdict_only=True)
    run_battles(models, prompts, models["alice"], tmp_path / "only", cfg, progress=False)
    judged = rows(tmp_path / "only")
    assert len(judged) == 8 and not rows(tmp_path / "only", "unparsable.jsonl")
    assert all(r["verdict_raw"] in ("[[A]]", "[[B]]", "[[C]]", "[[D]]") and r["attempts"] == 1 for r in judged)
    free = BattleConfig(battles_per_pair=4, max_tokens=8, judge_max_tokens=16, judge_retries=0)
    run_battles(models, prompts, models["alice"], tmp_path / "free", free, progress=False)
    assert len(rows(tmp_path / "free", "unparsable.jsonl")) == 8 and not rows(tmp_path / "free")
