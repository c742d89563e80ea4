"""Blind battles on the server (`groundup serve --arena-log FILE`, serve/votes.py): a battle between the base model
and an adapter, each side's answer equal to that model's own greedy reply (so the sides are mapped to the right
names), the names hidden until the vote, each of the four buttons logged as FastChat's winner, one vote per
battle, whole lines under concurrent appends, the refusals (too few models, off, unknown or repeated ids), the
endpoints fuzzed from the OpenAPI schema, and the page itself in a headless Chromium."""

from __future__ import annotations

import argparse
import json
import threading

import httpx
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings, strategies as st

from groundup.errors import ConfigError
from groundup.model.lora import LoraConfig
from groundup.serve.app import create_app
from groundup.serve.commands import build_server, serve_arguments
from groundup.serve.server import Limits, Server
from groundup.serve.votes import ROW_KEYS, BattleLog
from infer_helpers import model_dir, small_tokenizer
from serve_helpers import LiveServer, make_adapter, served_model, watching_logs
from test_serve_browser import _slow_and_endless, _wait, browser  # noqa: F401 - the headless Chromium fixture

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who art thou?"}]
SETTINGS = {"temperature": 0, "max_tokens": 12}


def arena_server(tmp_path, adapters=True, max_tokens=32, **kwargs) -> Server:
    base = served_model()
    named = {"sql": tmp_path / "sql"} if adapters else None
    if adapters:
        make_adapter(base, named["sql"], LoraConfig(rank=4, alpha=8, targets=["all"]), seed=1)
    return Server(base, small_tokenizer(), name="tiny", adapters=named,
                  limits=Limits(max_batch=4, max_tokens=max_tokens),
                  arena_log=kwargs.pop("arena_log", tmp_path / "votes.jsonl"), **kwargs)


@pytest.fixture
def watch():
    """Every ERROR record and traceback, from the root logger and uvicorn's (which do not propagate)."""
    with watching_logs() as handler:
        yield handler


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("arena")
    with TestClient(create_app(arena_server(path))) as client:
        yield client, path / "votes.jsonl"


def rows(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def answer(client, battle_id, side, stream) -> tuple[str, set[str]]:
    """The side's text and the `model` fields the client was sent."""
    body = {"battle_id": battle_id, "side": side, "stream": stream}
    if not stream:
        r = client.post("/arena/answer", json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"], {r.json()["model"]}
    with client.stream("POST", "/arena/answer", json=body) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line and line != "data: [DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    return text, {c["model"] for c in chunks}


@pytest.mark.parametrize("vote, button, winner", [("a", "A is better", "model_a"), ("b", "B is better", "model_b"),
                                                  ("tie", "Tie", "tie"), ("bothbad", "Both are bad", "tie (bothbad)")])
def test_a_battle_is_answered_blind_and_its_vote_logged_with_the_names(served, vote, button, winner):
    client, log = served
    before = len(rows(log)) if log.exists() else 0
    r = client.post("/arena/battle", json={"messages": MESSAGES, **SETTINGS})
    assert r.status_code == 200 and set(r.json()) == {"battle_id", "sides"}
    assert "tiny" not in r.text and "sql" not in r.text
    battle_id = r.json()["battle_id"]
    text_a, shown_a = answer(client, battle_id, "a", stream=False)
    text_b, shown_b = answer(client, battle_id, "b", stream=True)
    assert shown_a == {"Model A"} and shown_b == {"Model B"}  # the names stay on the server

    r = client.post("/arena/vote", json={"battle_id": battle_id, "vote": vote})
    assert r.status_code == 200, r.text
    revealed = r.json()
    assert {revealed["model_a"], revealed["model_b"]} == {"tiny", "sql"} and revealed["winner"] == winner
    # each side is its model's own greedy reply: the sides were mapped to the right names
    for name, text in ((revealed["model_a"], text_a), (revealed["model_b"], text_b)):
        own = client.post("/v1/chat/completions", json={"model": name, "messages": MESSAGES, **SETTINGS}).json()
        assert own["choices"][0]["message"]["content"] == text
    assert text_a != text_b  # the adapter answers differently, so the check above can tell the sides apart

    written = rows(log)
    assert len(written) == before + 1
    row = written[-1]
    assert tuple(row) == ROW_KEYS
    assert {k: row[k] for k in ROW_KEYS if k != "tstamp"} == {
        "battle_id": battle_id, "question_id": row["question_id"], "category": "", "model_a": revealed["model_a"],
        "model_b": revealed["model_b"], "winner": winner, "judge": "human", "swap": False, "prompt": "Who art thou?",
        "answer_a": text_a, "answer_b": text_b, "verdict_raw": button, "attempts": 1}
    assert len(row["question_id"]) == 16 and isinstance(row["tstamp"], float)
    assert all(w["question_id"] == row["question_id"] for w in written)  # one prompt, one question id

    again = client.post("/arena/vote", json={"battle_id": battle_id, "vote": "tie"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_voted"
    assert len(rows(log)) == before + 1


def test_both_models_are_drawn_in_both_orders(served):
    client, _ = served
    seen = set()
    for _ in range(40):
        battle_id = client.post("/arena/battle", json={"messages": MESSAGES[1:], "max_tokens": 2}).json()["battle_id"]
        seen.add(client.app.state.server.arena.open_battles[battle_id].models["a"])
    assert seen == {"tiny", "sql"}


def test_refusals_name_the_problem_and_never_the_models(served):
    client, log = served
    before = log.read_text()
    r = client.post("/arena/vote", json={"battle_id": "nope", "vote": "a"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "battle_not_found"
    assert r.json()["error"]["message"].startswith("no battle 'nope' on this server")
    battle_id = client.post("/arena/battle", json={"messages": MESSAGES, **SETTINGS}).json()["battle_id"]
    r = client.post("/arena/vote", json={"battle_id": battle_id, "vote": "a"})
    assert r.status_code == 409 and r.json()["error"]["message"] == (
        f"Model A has not answered battle {battle_id} yet: vote once both answers are in")
    answer(client, battle_id, "a", stream=False)
    r = client.post("/arena/answer", json={"battle_id": battle_id, "side": "a"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "already_answered"
    r = client.post("/arena/vote", json={"battle_id": battle_id, "vote": "a"})
    assert r.status_code == 409 and "Model B has not answered" in r.json()["error"]["message"]
    too_long = client.post("/arena/battle", json={"messages": [{"role": "user", "content": "la " * 400}]})
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
    last = client.post("/arena/battle", json={"messages": MESSAGES[:1]})
    assert last.status_code == 400 and "the last message must be the user's prompt" in last.json()["error"]["message"]
    bad = client.post("/arena/vote", json={"battle_id": battle_id, "vote": "A"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "vote"
    for r in (client.post("/arena/answer", json={"battle_id": battle_id, "side": "a"}),
              client.post("/arena/vote", json={"battle_id": battle_id, "vote": "a"})):
        assert "tiny" not in r.text and "sql" not in r.text
    assert log.read_text() == before


def test_an_answer_stopped_by_its_client_is_voted_with_the_text_it_streamed(tmp_path):
    server = arena_server(tmp_path, max_tokens=200)
    with LiveServer(server) as live:
        post = lambda path, body: httpx.post(live.url + path, json=body, timeout=30)  # noqa: E731
        battle = post("/arena/battle", {"messages": MESSAGES, "temperature": 0, "max_tokens": 200})
        battle_id = battle.json()["battle_id"]
        assert post("/arena/answer", {"battle_id": battle_id, "side": "a"}).status_code == 200
        _slow_and_endless(server.model, server.tokenizer.stop_ids)  # now 20 ms a step, never a stop token
        steps, received = server.scheduler.steps, ""
        body = {"battle_id": battle_id, "side": "b", "stream": True}
        with httpx.stream("POST", live.url + "/arena/answer", json=body, timeout=30) as r:
            for line in r.iter_lines():
                chunk = json.loads(line[6:]) if line.startswith("data: {") else None
                received += (chunk["choices"][0]["delta"].get("content", "") if chunk and chunk["choices"] else "")
                if len(received) > 3:
                    break  # the client goes away: the page's stop button
        vote = _wait(lambda: (r := post("/arena/vote", {"battle_id": battle_id, "vote": "b"})).status_code != 409 and r,
                     timeout=5, what="the stopped answer to count as answered")
        assert vote.status_code == 200, vote.text
        row = rows(tmp_path / "votes.jsonl")[-1]
        assert row["answer_b"].startswith(received) and len(row["answer_b"]) > 3
        assert server.scheduler.steps - steps < 100 and server.scheduler.running == 0  # stopped, not run to 200


def test_fewer_than_two_models_is_refused_at_start_and_409_when_they_may_come(tmp_path):
    with pytest.raises(ConfigError, match="blind battles need at least two served models, and this server serves "
                                          "only tiny; add one with --adapter NAME=DIR") as e:
        arena_server(tmp_path, adapters=False)
    assert e.value.key == "arena-log"
    with TestClient(create_app(arena_server(tmp_path, adapters=False, allow_adapter_updates=True))) as client:
        assert client.get("/arena").json()["ready"] is False
        r = client.post("/arena/battle", json={"messages": MESSAGES})
        assert r.status_code == 409 and r.json()["error"]["code"] == "too_few_models"
        assert r.json()["error"]["message"].startswith("blind battles need at least two served models; this server "
                                                       "serves 1 (tiny): load another")


def test_without_the_flag_battles_are_off_and_say_how_to_turn_them_on(tmp_path):
    server = arena_server(tmp_path, arena_log=None)
    with TestClient(create_app(server)) as client:
        assert client.get("/arena").json()["enabled"] is False
        r = client.post("/arena/battle", json={"messages": MESSAGES})
        assert r.status_code == 404 and "start it with --arena-log FILE" in r.json()["error"]["message"]


def test_the_cli_refuses_one_model_before_loading_it(tmp_path):
    p = argparse.ArgumentParser()
    serve_arguments(p)
    assert "--arena-log" in p.format_help()
    args = p.parse_args(["--model", str(tmp_path / "missing"), "--arena-log", str(tmp_path / "v.jsonl")])
    with pytest.raises(ConfigError, match="serves only missing; add one with --adapter") as e:
        build_server(args)  # the model directory does not exist: the refusal came first
    assert e.value.key == "arena-log"
    base = model_dir(tmp_path / "base", served_model())
    make_adapter(served_model(), tmp_path / "sql", LoraConfig(rank=4, alpha=8, targets=["all"]), seed=1)
    server = build_server(p.parse_args(["--model", str(base), "--adapter", f"sql={tmp_path / 'sql'}",
                                        "--arena-log", str(tmp_path / "v.jsonl")]))
    assert server.model_names() == ["base", "sql"] and server.arena.log.path == tmp_path / "v.jsonl"


def test_concurrent_votes_append_whole_lines(tmp_path):
    path = tmp_path / "votes.jsonl"
    path.write_text('{"battle_id": "cut sho')  # a line an earlier writer left unfinished
    log = BattleLog(path)
    rows_each, big = 25, "x" * 200_000  # lines far longer than a pipe's atomic write or a stdio buffer

    def vote(worker):
        for i in range(rows_each):
            log.append({"battle_id": f"{worker}-{i}", "answer_a": big + str(worker)})

    threads = [threading.Thread(target=vote, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = path.read_text().split("\n")
    assert lines[0] == '{"battle_id": "cut sho' and lines[-1] == ""
    parsed = [json.loads(line) for line in lines[1:-1]]
    assert sorted(r["battle_id"] for r in parsed) == sorted(f"{w}-{i}" for w in range(6) for i in range(rows_each))
    assert all(r["answer_a"] == big + r["battle_id"].split("-")[0] for r in parsed)


def test_an_unwritable_log_is_refused_at_start(tmp_path):
    with pytest.raises(ConfigError, match="--arena-log .*: cannot append to it"):
        BattleLog(tmp_path / "no-such-dir" / "votes.jsonl")


def test_the_arena_endpoints_fuzzed_from_the_schema_never_get_a_5xx(tmp_path, watch, capfd):
    with LiveServer(arena_server(tmp_path)) as live:
        schema = schemathesis.openapi.from_url(live.url + "/openapi.json").include(path_regex="^/arena")
        cases = st.one_of(schema.as_strategy(schemathesis.GenerationMode.POSITIVE),
                          schema.as_strategy(schemathesis.GenerationMode.NEGATIVE))
        statuses: dict[int, int] = {}

        @settings(max_examples=150, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=cases)
        def fuzz(case):
            response = case.call(base_url=live.url, timeout=60)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, f"{response.status_code} {response.text[:300]}\n{case.as_curl_command()}"

        fuzz()
        assert watch.bad == [] and "Traceback" not in "".join(capfd.readouterr())
        assert {200, 400, 404} <= set(statuses)
        assert httpx.get(live.url + "/health").json()["status"] == "ok"


def test_the_page_runs_a_blind_battle_and_reveals_the_names_after_the_vote(browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    with LiveServer(arena_server(tmp_path)) as live:
        browser.get(live.url + "/#arena")
        find = lambda css: browser.find_element(By.CSS_SELECTOR, css)  # noqa: E731
        _wait(lambda: "arena" in find("body").get_attribute("class"), what="blind battle mode")
        assert find("#mode").text == "Chat" and not find("#model").is_displayed()
        for css, value in (("#system", "Answer briefly."), ("#temperature", "0"), ("#max-tokens", "12")):
            find(css).clear()
            find(css).send_keys(value)
        find("#input").send_keys("Who art thou?")
        find("#send").click()
        done = _wait(lambda: (len(found := browser.find_elements(By.CSS_SELECTOR, ".side .msg[data-state=done]")) == 2
                              and found), what="both answers")
        texts = [d.find_element(By.CSS_SELECTOR, ".body").get_attribute("textContent") for d in done]
        assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".side .name")] == ["", ""]
        assert [b.is_enabled() for b in browser.find_elements(By.CSS_SELECTOR, "[data-vote]")] == [True] * 4
        find("[data-vote=b]").click()
        _wait(lambda: find("#verdict").text, what="the revealed names")
        row = rows(tmp_path / "votes.jsonl")[-1]
        assert row["winner"] == "model_b" and row["verdict_raw"] == "B is better" and row["prompt"] == "Who art thou?"
        assert [row["answer_a"], row["answer_b"]] == texts
        names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".side .name")]
        assert names == [f"\u2014 {row['model_a']}", f"\u2014 {row['model_b']}"]
        assert find("#verdict").text == (f"Recorded: B is better. Model A was {row['model_a']}, Model B was "
                                         f"{row['model_b']}. Type another prompt for a new battle.")
        assert [b.is_enabled() for b in browser.find_elements(By.CSS_SELECTOR, "[data-vote]")] == [False] * 4
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
        assert errors == []
