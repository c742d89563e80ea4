"""`groundup serve`'s API in-process: OpenAI's request and response shapes, outputs equal to the engine's
(greedy, and sampled for a seed), log-probs equal to the shared scorer's, streaming as OpenAI streams,
4xx error objects for bad requests (the server goes on), the API key, tokenizer endpoints, metrics and
the chat page."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from fastapi.testclient import TestClient

from groundup.infer import Generator
from groundup.model.logprobs import token_stats
from groundup.serve.app import create_app
from infer_helpers import small_tokenizer
from serve_helpers import make_server, served_model

PROMPTS = ["To be, or not to be", "Hello", "What light through yonder window breaks"]


@pytest.fixture(scope="module")
def model():
    return served_model()


@pytest.fixture(scope="module")
def gen(model):
    return Generator(copy.deepcopy(model), small_tokenizer())  # the engine, on its own copy


@pytest.fixture(scope="module")
def client(model):
    with TestClient(create_app(make_server(model, max_batch=8, max_tokens=64, max_body_bytes=20_000))) as c:
        yield c


def completion(client, **body):
    r = client.post("/v1/completions", json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


def events(client, path, body) -> list:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_models_and_health(client):
    assert client.get("/health").json()["status"] == "ok"
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["object"] == "model" and models["data"][0]["max_model_len"] == 256
    assert client.get("/v1/models/tiny").json()["id"] == "tiny"


def test_greedy_completions_equal_the_engine(client, gen):
    body = completion(client, prompt=PROMPTS, max_tokens=24, temperature=0)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == "tiny"
    expected = gen.complete(PROMPTS, max_new_tokens=24, temperature=0)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == [c.text for c in expected]
    assert [c["finish_reason"] for c in body["choices"]] == [c.finish_reason for c in expected]
    assert body["usage"] == {"prompt_tokens": sum(c.prompt_tokens for c in expected),
                             "completion_tokens": sum(len(c.token_ids) for c in expected),
                             "total_tokens": sum(c.prompt_tokens + len(c.token_ids) for c in expected)}
    # token ids are used as they are (no prefix), n choices each equal the engine's
    ids = [gen.tokenizer.eot_id, *gen.tokenizer.encode(PROMPTS[0])]
    body = completion(client, prompt=[ids, ids[:4]], max_tokens=10, temperature=0, n=2)
    ref = gen.complete_ids([ids, ids[:4]], max_new_tokens=10, temperature=0)
    assert [c["text"] for c in body["choices"]] == [ref[0].text] * 2 + [ref[1].text] * 2


def test_a_stop_string_ends_the_text_as_in_the_engine(client, gen):
    full = gen.generate([PROMPTS[2]], max_new_tokens=24, temperature=0)[0]
    stop = full[5:8]
    body = completion(client, prompt=PROMPTS[2], max_tokens=24, temperature=0, stop=[stop])
    assert body["choices"][0]["text"] == full[: full.index(stop)] and body["choices"][0]["finish_reason"] == "stop"
    pieces = [c["choices"][0]["text"] for c in events(client, "/v1/completions", {
        "prompt": PROMPTS[2], "max_tokens": 24, "temperature": 0, "stop": stop, "stream": True})]
    assert "".join(pieces) == full[: full.index(stop)]  # the stop string (split across tokens) never went out


def test_seeded_sampling_equals_the_engine(client, gen):
    options = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, repetition_penalty=1.2)
    body = completion(client, prompt=PROMPTS[0], max_tokens=20, seed=11, n=2, **options)
    for i, choice in enumerate(body["choices"]):  # choice i samples with seed + i
        assert choice["text"] == gen.generate([PROMPTS[0]], max_new_tokens=20, seed=11 + i, **options)[0]
    again = completion(client, prompt=PROMPTS[0], max_tokens=20, seed=11, n=2, **options)
    assert [c["text"] for c in again["choices"]] == [c["text"] for c in body["choices"]]


def test_chat_equals_the_engine(client, gen):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who art thou?"}]
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 16,
                                                  "temperature": 0})
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    assert choice["message"]["content"] == "".join(gen.chat(messages, max_new_tokens=16, temperature=0))
    # content as a list of text parts, and the developer role, are accepted
    parts = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "text", "text": "Who art "}, {"type": "text", "text": "thou?"}]}]
    again = client.post("/v1/chat/completions", json={"messages": parts, "max_completion_tokens": 16,
                                                      "temperature": 0}).json()
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]


def test_logprobs_of_generated_tokens(client, gen):
    body = completion(client, prompt=PROMPTS[1], max_tokens=8, temperature=0, logprobs=3)
    lp = body["choices"][0]["logprobs"]
    ref = gen.complete([PROMPTS[1]], max_new_tokens=8, temperature=0, logprobs=True, top_logprobs=3)[0]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ref.token_ids)
    assert lp["token_logprobs"] == pytest.approx(ref.logprobs, abs=1e-5)
    for top, v, expected in zip(lp["top_logprobs"], lp["token_logprobs"], ref.top_logprobs):
        assert max(top.values()) == pytest.approx(v, abs=1e-6)  # greedy: the chosen token is the likeliest
        assert len(top) == len({gen.tokenizer.decode([i]) for i, _ in expected})  # keyed by token string
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                                                     "temperature": 0, "logprobs": True, "top_logprobs": 2}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == chat["usage"]["completion_tokens"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and len(entry["top_logprobs"]) == 2
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"], abs=1e-6)
        assert bytes(entry["bytes"]).decode("utf-8", "replace") == entry["token"]


def test_echo_logprobs_are_the_shared_scorers(client, model):
    tok = small_tokenizer()
    body = completion(client, prompt=PROMPTS[2], max_tokens=0, echo=True, logprobs=2)
    choice = body["choices"][0]
    assert choice["text"] == PROMPTS[2] and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    ids = [tok.eot_id, *tok.encode(PROMPTS[2])]
    assert lp["tokens"][0] == "<|end_of_text|>" and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    x = torch.tensor([ids])
    st = token_stats(model, x[:, :-1], x[:, 1:], top_k=2)
    assert lp["token_logprobs"][1:] == pytest.approx(st.logprobs[0].tolist(), abs=1e-5)
    greedy = [max(top.values()) == v for top, v in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:])]
    assert greedy == st.greedy[0].tolist()
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    # echo with generation: prompt then completion, in text and log-probs
    both = completion(client, prompt=PROMPTS[2], max_tokens=4, echo=True, logprobs=1, temperature=0)["choices"][0]
    assert both["text"].startswith(PROMPTS[2]) and len(both["logprobs"]["tokens"]) == len(ids) + 4


def test_streams_are_openais(client, gen):
    messages = [{"role": "user", "content": "Speak, my lord."}]
    chunks = events(client, "/v1/chat/completions", {"messages": messages, "max_tokens": 12, "temperature": 0,
                                                     "stream": True, "stream_options": {"include_usage": True}})
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert all(c["usage"] is None for c in chunks[:-1])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert text == "".join(gen.chat(messages, max_new_tokens=12, temperature=0))
    chunks = events(client, "/v1/completions", {"prompt": PROMPTS[:2], "max_tokens": 6, "temperature": 0,
                                                "stream": True, "logprobs": 1})
    assert all("usage" not in c for c in chunks)
    expected = gen.complete(PROMPTS[:2], max_new_tokens=6, temperature=0)
    for i in range(2):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in mine) == expected[i].text
        assert mine[-1]["finish_reason"] == expected[i].finish_reason
        assert all(c["finish_reason"] is None for c in mine[:-1])
        assert sum(len(c["logprobs"]["tokens"]) for c in mine if c["logprobs"]) == len(expected[i].token_ids)


@pytest.mark.parametrize("body, status, param", [
    (b'{"prompt": "x",', 400, None),
    (b'[1, 2]', 400, None),
    ({"prompt": "x", "temprature": 1}, 400, "temprature"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [[1, 2], []]}, 400, "prompt"),
    ({"prompt": [1, 99999]}, 400, "prompt"),
    ({"prompt": "x " * 300}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": 65}, 400, "max_tokens"),
    ({"prompt": "x " * 100, "max_tokens": 60}, 400, "max_tokens"),
    ({"prompt": "x", "n": 9}, 400, "n"),
    ({"prompt": "x", "model": "gpt-5"}, 404, "model"),
    ({"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": "x" * 30_000}, 413, None),
])
def test_bad_requests_get_openai_error_objects_and_the_server_goes_on(client, body, status, param):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["param"] == param
    assert completion(client, prompt="ok", max_tokens=2)["choices"][0]["finish_reason"]


def test_bad_chats_and_paths(client):
    bad = [{"messages": []}, {"messages": [{"role": "wizard", "content": "x"}]},
           {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
           {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
           {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}]
    for body in bad:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["message"], body
    assert client.get("/v1/nothing").status_code == 404 and client.get("/v1/nothing").json()["error"]["code"] == "not_found"
    assert client.get("/v1/completions").status_code == 405 and "error" in client.get("/v1/completions").json()


def test_the_api_key_is_required_everywhere_but_the_page_and_health(model):
    with TestClient(create_app(make_server(model, api_key="s3cret"))) as c:
        assert c.get("/health").status_code == 200 and c.get("/").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert c.get("/v1/models", headers=headers).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=ok).status_code == 200


def test_tokenizer_endpoints(client):
    tok = small_tokenizer()
    r = client.post("/tokenize", json={"prompt": "To be<|end_of_text|>", "add_special_tokens": False}).json()
    assert r["tokens"] == tok.encode("To be") + [tok.eot_id] and r["count"] == len(r["tokens"])
    assert client.post("/tokenize", json={"prompt": "To be"}).json()["tokens"] == [tok.eot_id, *tok.encode("To be")]
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()["tokens"]
    assert chat == tok.render_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=True)[0]
    assert client.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == "To be<|end_of_text|>"
    assert client.post("/detokenize", json={"tokens": [10**6]}).status_code == 400
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|end_of_text|>" and info["chat_template"] and info["model_max_length"] == 256


def test_metrics_are_prometheus_text_under_vllm_names(client):
    """The values themselves: test_serve_metrics.py."""
    completion(client, prompt="x", max_tokens=3)
    r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=")
    text = r.text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:time_per_output_token_seconds_count", "vllm:e2e_request_latency_seconds_sum",
                 "groundup_requests_total", "groundup_batch_size_bucket", "groundup_decode_steps_total"):
        assert f"\n{name}{{" in text or f"\n{name} " in text, name
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0' in text
    assert 'groundup_requests_total{endpoint="/v1/completions",status="200"}' in text
    assert "_created" not in text  # as vLLM: no creation-time series


def test_the_chat_page_is_one_self_contained_file(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in r.headers["content-security-policy"]
    html = r.text
    assert "http://" not in html and "https://" not in html and "<script src" not in html and "@import" not in html
    for element in ('id="model"', 'id="system"', 'id="temperature"', 'id="max-tokens"', 'id="send"', 'id="stop"',
                    'id="new-chat"', "AbortController", "getReader"):
        assert element in html


def test_streams_never_send_half_a_character_or_part_of_a_stop_string(model):
    """A model forced to write "A", 0xC3, 0xA9 ("é" split in two tokens), "B", "x", "y", "z" with stop
    string "xy" (split across tokens): the stream sends "Aé" and "B", never U+FFFD nor "x"."""
    tok = small_tokenizer()
    by_bytes = {tok.id_to_bytes(i): i for i in range(tok.vocab_size) if not tok.is_special(i)}
    forced = [by_bytes[b] for b in (b"A", b"\xc3", b"\xa9", b"B", b"x", b"y", b"z")]
    calls = {"n": 0}

    def forcing(logits_of):  # every logits the engine computes (prefill and decode) go through model.logits
        def logits(x):
            out = logits_of(x).fill_(-1e9)
            out[..., forced[min(calls["n"], len(forced) - 1)]] = 0.0
            calls["n"] += 1
            return out
        return logits

    with TestClient(create_app(make_server(copy.deepcopy(model)))) as c:
        served = c.app.state.server.model
        served.logits = forcing(served.logits)
        chunks = events(c, "/v1/completions", {"prompt": "Q", "max_tokens": 7, "stop": ["xy"], "stream": True,
                                               "temperature": 0})
    pieces = [ch["choices"][0]["text"] for ch in chunks]
    assert "".join(pieces) == "AéB" and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("\ufffd" not in p and "x" not in p for p in pieces)
