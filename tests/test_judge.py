"""The judge: chat sources (in-process engine, OpenAI-compatible endpoint), strict verdicts, retries, the swap."""

from __future__ import annotations

import pytest

from groundup.errors import ConfigError
from groundup.infer.engine import Generator
from groundup.judge.sources import ChatSource, EngineSource, SourceError, open_source
from groundup.judge.verdict import (A, B, BOTHBAD, RETRY, TIE, PairwiseJudge, combine, is_consistent, judge_messages,
                                    load_rubric, parse_verdict, DEFAULT_RUBRIC)
from infer_helpers import model_dir
from judge_helpers import FakeOpenAI

pytest.importorskip("openai")

CONV = [[{"role": "user", "content": "What is 2+3?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
        [{"role": "user", "content": "What is 2+3?"}]]


class Scripted:
    """A ChatSource double: replies from a list, in call order; records every conversation it was sent."""

    name = "scripted"

    def __init__(self, replies):
        self.replies, self.sent = list(replies), []

    def chat(self, conversations, max_tokens, temperature, seed):
        self.sent += [(c, seed + i) for i, c in enumerate(conversations)]
        return [self.replies.pop(0) if isinstance(self.replies[0], str) else self.replies[0](c) for c in conversations]


@pytest.mark.parametrize("reply, verdict", [
    ("A is right and B is wrong.\n[[A]]", A),
    ("Reasons...\n\n**[[B]]**.", B),
    ("Equally good. Verdict: [[C]]", TIE),
    ("Neither answers the question.\n[[D]]\n", BOTHBAD),
    ("[[A]] clearly. Final verdict: [[A]]", A),  # the same verdict twice is still one verdict
])
def test_parse_verdict_accepts_a_final_token(reply, verdict):
    assert parse_verdict(reply) == verdict


@pytest.mark.parametrize("reply, reason", [
    ("A is better.", "no verdict token"),
    ("", "no verdict token"),
    ("[[A]] because it is right.", "does not end with its verdict"),
    ("Not [[B]]; I pick [[A]]", "more than one verdict ([[B]], [[A]])"),
    ("[[E]]", "[[E]] is not a verdict"),
    ("[[a]]", "[[a]] is not a verdict"),
    ("[A]", "no verdict token"),
    ("[[A]][[B]]", "more than one verdict"),
])
def test_parse_verdict_refuses_anything_else(reply, reason):
    with pytest.raises(ValueError, match=__import__("re").escape(reason)):
        parse_verdict(reply)


def test_judge_prompt_holds_rubric_question_and_both_answers():
    messages = judge_messages("RUBRIC", CONV[1], "red", "blue")
    assert messages[0] == {"role": "system", "content": "RUBRIC"}
    user = messages[1]["content"]
    assert user.index("Name a colour.") < user.index("red") < user.index("blue")
    assert "Be brief." not in user and user.rstrip().endswith("[[D]] if both replies are bad.")


def test_malformed_verdicts_are_retried_then_counted():
    # item 0 parses at once; item 1 on its second ask; item 2 never (1 + 2 retries = 3 replies refused)
    source = Scripted(["ok [[B]]", "I like A", "nothing", "[[A]]", "still nothing", "[[A]] or [[B]]"])
    out = PairwiseJudge(source, "R", retries=2).judge([("q0", "a", "b"), ("q1", "a", "b"), ("q2", "a", "b")], seed=10)
    assert [(j.verdict, j.attempts) for j in out] == [(B, 1), (A, 2), (None, 3)]
    assert out[2].raw == "[[A]] or [[B]]" and "more than one verdict" in out[2].error
    assert source.replies == []  # exactly 6 replies were asked for
    retry = source.sent[3][0]  # item 1's retry: its refused reply, then the reminder
    assert retry[-2:] == [{"role": "assistant", "content": "I like A"}, {"role": "user", "content": RETRY}]
    assert [s for _, s in source.sent] == [10, 11, 12, 12, 13, 14]  # first asks batched; a retry seeded seed+i+k


def test_swap_cancels_a_judge_that_always_prefers_position_a():
    source = Scripted([lambda conv: "Looks better.\n[[A]]"])
    pairs = PairwiseJudge(source, "R").judge_swapped([("q", "good", "bad"), ("q2", "x", "y")], seed=0)
    shown = [c[1]["content"] for c, _ in source.sent]
    assert shown[0].index("good") < shown[0].index("bad") and shown[1].index("bad") < shown[1].index("good")
    assert [(f.verdict, s.verdict) for f, s in pairs] == [(A, A), (A, A)]
    assert [combine(f.verdict, s.verdict) for f, s in pairs] == ["tie", "tie"]
    assert [is_consistent(f.verdict, s.verdict) for f, s in pairs] == [False, False]


@pytest.mark.parametrize("first, swapped, combined, consistent", [
    (A, B, "first", True), (B, A, "second", True), (TIE, TIE, "tie", True), (BOTHBAD, BOTHBAD, "tie (bothbad)", True),
    (A, A, "tie", False), (B, B, "tie", False), (A, TIE, "tie", False), (TIE, BOTHBAD, "tie", False),
    (None, A, None, None), (B, None, None, None),
])
def test_combine_follows_fastchats_two_order_rule(first, swapped, combined, consistent):
    assert combine(first, swapped) == combined
    assert is_consistent(first, swapped) is consistent


def test_rubric_file(tmp_path):
    assert load_rubric(None) == load_rubric("") == DEFAULT_RUBRIC
    (tmp_path / "c.md").write_text("Be kind.\n\n")
    assert load_rubric(tmp_path / "c.md") == "Be kind.\n"
    (tmp_path / "e.md").write_text(" \n")
    with pytest.raises(ConfigError, match="empty"):
        load_rubric(tmp_path / "e.md")


def test_engine_source_gives_the_engines_text_for_the_same_seed(tmp_path):
    path = model_dir(tmp_path / "m")
    source = open_source(str(path))
    assert isinstance(source, EngineSource) and isinstance(source, ChatSource)
    got = source.chat(CONV, max_tokens=12, temperature=0.9, seed=7)
    gen = Generator.from_checkpoint(path)
    want = ["".join(gen.chat(c, max_new_tokens=12, temperature=0.9, seed=7 + i)) for i, c in enumerate(CONV)]
    assert got == want
    assert got[0] != got[2]  # the same question, rows seeded 7 and 9: sampled apart
    assert source.chat(CONV[:1], max_tokens=12, temperature=0.9, seed=7) == got[:1]
    # longer than the context: the reply gets half of it, the conversation loses its start
    long = [{"role": "user", "content": "hi " * 400}]
    half = gen.cfg.max_seq_len // 2
    assert source.chat([long], max_tokens=10_000, temperature=0.9, seed=1) == [
        "".join(gen.chat(long, max_new_tokens=half, temperature=0.9, seed=1, overflow="truncate"))]


def test_endpoint_source_reads_the_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-secret-123")
    with FakeOpenAI(lambda body: f"echo {body['messages'][-1]['content']} seed={body['seed']}", ["m1"]) as server:
        named = open_source(server.url.replace("http://", "http://user:pw@") + "#m1", api_key_env="JUDGE_KEY")
        assert named.name == server.url + "#m1"  # no credentials in the name
        source = open_source(server.url, api_key_env="JUDGE_KEY", concurrency=3)
        assert source.name == server.url + "#m1"  # the model from /v1/models
        out = source.chat(CONV, max_tokens=5, temperature=0.0, seed=4)
        assert out == ["echo What is 2+3? seed=4", "echo Name a colour. seed=5", "echo What is 2+3? seed=6"]
        chats = server.chats()
        assert {r["headers"]["authorization"] for r in server.requests} == {"Bearer sk-secret-123"}
        assert all(b["model"] == "m1" and b["max_tokens"] == 5 for b in chats)
        assert sorted(b["messages"][0]["role"] for b in chats) == ["system", "user", "user"]
    monkeypatch.delenv("JUDGE_KEY")
    with pytest.raises(ConfigError, match="api_key_env = 'JUDGE_KEY'"):
        open_source("http://127.0.0.1:9/v1#m", api_key_env="JUDGE_KEY")


def test_endpoint_source_retries_server_errors_and_stops_on_refusal(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    calls = []

    def reply(body):
        calls.append(body["seed"])
        if body["seed"] == 1:
            return 401  # a wrong key: fatal, not retried
        return 503 if calls.count(body["seed"]) < 2 else "fine"  # one 503, then an answer

    with FakeOpenAI(reply, ["a", "b"]) as server:
        with pytest.raises(SourceError, match="serves 2 models"):
            open_source(server.url)
        source = open_source(server.url + "#b", retries=2, concurrency=1)
        assert source.chat(CONV[:1], 4, 0.0, seed=0) == ["fine"]
        with pytest.raises(SourceError) as e:
            source.chat(CONV, 4, 0.0, seed=0)
        assert e.value.fatal and "1 of 3 requests failed; row 1: HTTP 401" in str(e.value)
        assert e.value.results == ["fine", None, "fine"]
        assert calls.count(1) == 1 and calls.count(0) == 3
