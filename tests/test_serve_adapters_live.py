"""Adapters loaded and unloaded while the server runs (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter,
`serve --allow-adapter-updates`): a loaded adapter answers as the merged model does and is listed, an adapter
in use cannot be unloaded, an unloaded one is a 404, a reload under the same name (and index) answers with
the new weights (no stale prefix cache), bad requests are 400s naming the field, and the routes are off
(404 saying how to turn them on) unless the flag is given, behind the API key when there is one."""

from __future__ import annotations

import argparse
import asyncio
import copy

import httpx
import pytest
import torch

from groundup.infer import Generator
from groundup.infer.sampling import SamplingConfig
from groundup.model.lora import LoraConfig
from groundup.serve.adapters import AdapterBank
from groundup.serve.app import create_app
from groundup.serve.commands import serve_arguments
from groundup.serve.scheduler import AdapterGone, make_job
from infer_helpers import VOCAB, model_dir, small_tokenizer
from serve_helpers import LiveServer, make_adapter, make_server, served_model

openai = pytest.importorskip("openai")

# Over three blocks of 16 tokens, so a repeat is served from the prefix cache.
LONG = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """The base model, two saved adapters (all layers; attention with rsLoRA) and the models they merge into."""
    path = tmp_path_factory.mktemp("adapters")
    base = served_model()
    merged = {"all": make_adapter(base, path / "all", LoraConfig(rank=4, alpha=8, targets=["all"]), seed=1),
              "attn": make_adapter(base, path / "attn", LoraConfig(rank=2, alpha=4, targets=["attention"], rslora=True),
                                   seed=2)}
    return base, {"all": str(path / "all"), "attn": str(path / "attn")}, merged


@pytest.fixture(scope="module")
def live(adapters):
    base = adapters[0]
    with LiveServer(make_server(copy.deepcopy(base), max_batch=8, allow_adapter_updates=True)) as server:
        yield server


@pytest.fixture(autouse=True)
def _unload_leftovers(request):
    """A failing test leaves the shared server as it started (no adapters), so the next one is not misled."""
    yield
    if "live" in request.fixturenames:
        live = request.getfixturevalue("live")
        for name in live.server.bank.names:
            _unload(live.url, name)


def _greedy(model, prompt: str, n: int) -> str:
    return Generator(model, small_tokenizer()).generate([prompt], max_new_tokens=n, temperature=0)[0]


def _load(url: str, name: str, path: str, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path, **extra}, timeout=60)


def _unload(url: str, name: str) -> httpx.Response:
    return httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def test_load_use_and_unload_an_adapter_while_serving(live, adapters):
    base, dirs, merged = adapters
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]  # started with none

    r = _load(live.url, "sql", dirs["all"])
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' added successfully."
    cards = {m.id: m for m in client.models.list()}
    assert list(cards) == ["tiny", "sql"] and cards["sql"].parent == "tiny" and cards["sql"].root == dirs["all"]
    assert client.models.retrieve("sql").id == "sql"
    for prompt in ["Hello", "My lord"]:
        got = client.completions.create(model="sql", prompt=prompt, max_tokens=10, temperature=0)
        assert got.choices[0].text == _greedy(merged["all"], prompt, 10)
        plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0)
        assert plain.choices[0].text == _greedy(base, prompt, 10)

    # A long stream uses it: unloading is refused until the stream has ended.
    with httpx.stream("POST", live.url + "/v1/completions", timeout=60,
                      json={"model": "sql", "prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True}) as s:
        lines = s.iter_lines()
        next(lines)
        refused = _unload(live.url, "sql")
        rest = [line for line in lines if line]
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "adapter_in_use" and error["param"] == "lora_name" and "'sql'" in error["message"]
    assert rest[-1] == "data: [DONE]"
    assert [m.id for m in client.models.list()] == ["tiny", "sql"]  # still served

    r = _unload(live.url, "sql")
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' removed successfully."
    assert [m.id for m in client.models.list()] == ["tiny"]
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="sql", prompt="Hello", max_tokens=3)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("sql")
    again = _unload(live.url, "sql")
    assert again.status_code == 404 and "cannot be found" in again.json()["error"]["message"]


def test_a_reload_under_the_same_name_answers_with_the_new_adapter(live, adapters):
    _, dirs, merged = adapters
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
    bank, pool = live.server.bank, live.server.scheduler.core.pool

    def complete() -> str:
        return client.completions.create(model="x", prompt=LONG, max_tokens=8, temperature=0).choices[0].text

    assert _load(live.url, "x", dirs["all"]).status_code == 200
    index = bank.index("x")
    first = complete()
    hits = pool.hits
    assert complete() == first == _greedy(merged["all"], LONG, 8)
    assert pool.hits > hits  # the prompt's blocks are cached for this adapter

    assert _unload(live.url, "x").status_code == 200
    assert _load(live.url, "x", dirs["attn"]).status_code == 200
    assert bank.index("x") == index  # the same index, a different adapter
    hits = pool.hits
    assert complete() == _greedy(merged["attn"], LONG, 8)
    assert pool.hits == hits  # nothing cached for the old adapter was used

    # load_inplace replaces it at once (vLLM's flag); without it the name is taken.
    taken = _load(live.url, "x", dirs["all"])
    assert taken.status_code == 400 and "already been loaded" in taken.json()["error"]["message"]
    assert _load(live.url, "x", dirs["all"], load_inplace=True).status_code == 200
    assert complete() == _greedy(merged["all"], LONG, 8)
    assert _unload(live.url, "x").status_code == 200


def test_bad_requests_are_400s_naming_the_problem(live, adapters, tmp_path):
    base, dirs, _ = adapters
    other = served_model(d_model=32, n_heads=2, n_kv_heads=1)
    make_adapter(other, tmp_path / "other", LoraConfig(rank=2, alpha=4, targets=["attention"]), seed=1)
    plain = model_dir(tmp_path / "plain", served_model(), small_tokenizer())
    assert _load(live.url, "kept", dirs["attn"]).status_code == 200

    def post(path: str, body) -> tuple[int, dict]:
        r = httpx.post(live.url + path, json=body, timeout=60)
        return r.status_code, r.json()["error"]

    cases = [
        ("/v1/load_lora_adapter", {"lora_name": "a"}, "lora_path", "Missing required parameter"),
        ("/v1/load_lora_adapter", {"lora_name": "", "lora_path": dirs["all"]}, "lora_name", "at least 1 character"),
        ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(tmp_path / "missing")}, "lora_path", "no such"),
        ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(plain)}, "lora_path", "not a LoRA adapter"),
        ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(tmp_path / "other")}, "lora_path",
         "does not fit this model"),
        ("/v1/load_lora_adapter", {"lora_name": "tiny", "lora_path": dirs["all"]}, "lora_name", "base model's name"),
        ("/v1/load_lora_adapter", {"lora_name": "kept", "lora_path": dirs["all"]}, "lora_name", "already been loaded"),
        ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": dirs["all"], "lora_pth": 1}, "lora_pth",
         "Unrecognized request argument"),
        ("/v1/unload_lora_adapter", {}, "lora_name", "Missing required parameter"),
        ("/v1/unload_lora_adapter", {"lora_name": "tiny"}, "lora_name", "cannot be unloaded"),
    ]
    for path, body, param, words in cases:
        status, error = post(path, body)
        assert (status, error["param"]) == (400, param) and words in error["message"], (body, error)
    status, error = post("/v1/unload_lora_adapter", {"lora_name": "nope"})
    assert status == 404 and error["code"] == "model_not_found" and "kept" in error["message"]  # what is loaded
    assert [m["id"] for m in httpx.get(live.url + "/v1/models").json()["data"]] == ["tiny", "kept"]  # unchanged
    assert _unload(live.url, "kept").status_code == 200


def test_the_routes_are_off_without_the_flag_and_behind_the_key(adapters):
    base, dirs, merged = adapters
    off = make_server(copy.deepcopy(base))
    keyed = make_server(copy.deepcopy(base), adapters={"boot": dirs["attn"]}, api_key="sekret",
                        allow_adapter_updates=True)

    async def main():
        out = {}
        for name, server in (("off", off), ("keyed", keyed)):
            server.start()
            try:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(server)),
                                             base_url="http://test") as c:
                    body = {"lora_name": "a", "lora_path": dirs["all"]}
                    auth = {"Authorization": "Bearer sekret"} if name == "keyed" else {}
                    out[name] = [await c.post("/v1/load_lora_adapter", json=body),
                                 await c.post("/v1/unload_lora_adapter", json={"lora_name": "a"})]
                    if name == "keyed":
                        out[name] += [await c.post("/v1/load_lora_adapter", json=body, headers=auth),
                                      await c.post("/v1/completions", headers=auth, json={
                                          "model": "a", "prompt": "Hello", "max_tokens": 6, "temperature": 0}),
                                      await c.post("/v1/unload_lora_adapter", json={"lora_name": "a"}, headers=auth),
                                      await c.post("/v1/unload_lora_adapter", json={"lora_name": "boot"},
                                                   headers=auth)]  # one given at start-up
            finally:
                server.stop()
        return out

    out = _run(main())
    for r in out["off"]:
        assert r.status_code == 404 and "--allow-adapter-updates" in r.json()["error"]["message"]
    assert [r.status_code for r in out["keyed"]] == [401, 401, 200, 200, 200, 200]
    assert out["keyed"][3].json()["choices"][0]["text"] == _greedy(merged["all"], "Hello", 6)
    assert keyed.model_names() == ["tiny"]


def test_the_serve_flag_is_off_by_default():
    parser = argparse.ArgumentParser()
    serve_arguments(parser)
    assert not parser.parse_args(["--model", "m"]).allow_adapter_updates
    assert parser.parse_args(["--model", "m", "--allow-adapter-updates"]).allow_adapter_updates


def test_a_job_for_an_adapter_unloaded_after_its_request_named_it_is_refused(adapters):
    base, dirs, _ = adapters
    server = make_server(copy.deepcopy(base), adapters={"a": dirs["all"]})
    index = server.bank.index("a")
    server.bank.remove("a")  # what an unload does between the request's planning and its submission

    async def main():
        with pytest.raises(AdapterGone):
            server.scheduler.submit(make_job([1, 2], SamplingConfig(max_new_tokens=2), adapter=index), asyncio.Queue())

    _run(main())
    assert server.scheduler.queued == 0


def test_a_reused_index_holds_only_the_new_adapter(adapters):
    """A freed index reused by an adapter on fewer layers: the old adapter's other layers are zero there."""
    base, dirs, merged = adapters
    served = copy.deepcopy(base)
    bank = AdapterBank(served)
    assert bank.add("all", dirs["all"]) == 1 and bank.add("attn", dirs["attn"]) == 2
    key = bank.cache_key(1)
    assert bank.remove("all") == 1 and bank.names == ["attn"] and not bank.live(1)
    assert bank.install("attn2", bank.prepare(dirs["attn"])) == 1 and bank.cache_key(1) != key
    x = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        bank.select([1, 2, 0])
        out = served(x).logits
        expected = torch.cat([merged["attn"](x[:2]).logits, base(x[2:]).logits])
    assert (out - expected).abs().max() < 1e-4
    bank.remove("attn")  # the last index: the stacks shrink back
    assert all(layer.A.shape[0] == 2 for layer in bank.layers.values())


def _run(coro):
    return asyncio.run(coro)
