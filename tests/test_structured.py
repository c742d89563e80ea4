"""Structured output: decoding constrained by llguidance to a JSON schema, a regex, a choice or a grammar, in the
engine and through the server with the official `openai` client (OpenAI's response_format, vLLM's
structured_outputs), streaming or not; malformed constraints are a 400 naming the field."""

from __future__ import annotations

import json
import random
import re

import pytest

from groundup.errors import ConfigError
from groundup.infer import Generator
from groundup.infer.structured import Structured
from infer_helpers import small_tokenizer, tiny_model
from serve_helpers import LiveServer, make_server

jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "home"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 18, "maximum": 99},
                         "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
                         "home": {"type": "object", "additionalProperties": False, "required": ["x"],
                                  "properties": {"x": {"type": "number", "minimum": -1, "maximum": 1}}}}}


@pytest.fixture(scope="module")
def gen():
    return Generator(tiny_model(max_seq_len=256, init_std=0.2), small_tokenizer())


def test_every_sample_of_a_random_model_obeys_its_constraint(gen):
    for seed in range(6):
        out = gen.complete(["A person:"], max_new_tokens=150, temperature=1.0, seed=seed,
                           structured=Structured("json", SCHEMA))[0]
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    for text in gen.generate(["id:"] * 4, max_new_tokens=20, temperature=1.0, seed=1,
                             structured=Structured("regex", pattern)):
        assert re.fullmatch(pattern, text), text
    assert set(gen.generate(["?"] * 6, max_new_tokens=10, temperature=1.5, structured=Structured("choice", ["yes", "no"]))) \
        <= {"yes", "no"}
    lark = 'start: "(" num ("+" num)* ")"\nnum: /[1-9]/'
    for text in gen.generate(["sum:"] * 3, max_new_tokens=30, temperature=1.0, structured=Structured("grammar", lark)):
        assert re.fullmatch(r"\([1-9](\+[1-9])*\)", text), text
    free = gen.generate(["A person:"], max_new_tokens=20, temperature=0)[0]
    assert not free.startswith("{")  # the constraint, not the model, made the JSON


def test_constraints_are_read_and_checked_before_decoding():
    assert Structured.from_response_format({"type": "text"}) is None
    assert Structured.from_response_format({"type": "json_object"}) == Structured("json_object")
    assert Structured.from_response_format({"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}) \
        == Structured("json", SCHEMA)
    assert Structured.from_request({"json": json.dumps(SCHEMA)}) == Structured("json", SCHEMA)
    with pytest.raises(ConfigError, match="give exactly one of"):
        Structured.from_request({"regex": "a", "choice": ["b"]})
    with pytest.raises(ConfigError, match="choice: expected a non-empty list of strings"):
        Structured.from_request({"choice": []})
    with pytest.raises(ConfigError, match="unclosed character class"):
        Structured("regex", "[0-9").validate()
    with pytest.raises(ConfigError, match="response_format.type = 'xml'"):
        Structured.from_response_format({"type": "xml"})


@pytest.fixture(scope="module")
def client():
    with LiveServer(make_server(tiny_model(max_seq_len=256, init_std=0.2), max_batch=4)) as live:
        yield openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)


def test_the_openai_client_gets_json_that_validates(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Who?"}],
                                           response_format=fmt, max_tokens=150, seed=3, n=2)
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Who?"}],
                                            response_format={"type": "json_object"}, max_tokens=150, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert isinstance(json.loads(text), dict)
    done = client.completions.create(model="tiny", prompt="Code:", max_tokens=12, temperature=1.0,
                                     extra_body={"structured_outputs": {"regex": "[A-Z]{2}[0-9]{4}"}})
    assert re.fullmatch("[A-Z]{2}[0-9]{4}", done.choices[0].text)
    picked = client.completions.create(model="tiny", prompt="?", max_tokens=5, extra_body={"guided_choice": ["a", "b"]})
    assert picked.choices[0].text in ("a", "b")


def test_a_malformed_constraint_is_a_400_and_the_server_stays_up(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=5, extra_body={"structured_outputs": {"regex": "(["}})
    assert e.value.body["param"] == "structured_outputs" and "regex" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema", "json_schema": {"schema": {"type": 7}}})
    assert e.value.body["param"] == "response_format"
    ok = client.completions.create(model="tiny", prompt="x", max_tokens=3)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_json_closes_within_max_tokens_whenever_the_schema_fits(gen, monkeypatch):
    """A random model writes digits and strings until max_tokens cuts them; near the budget the output is
    steered to close (infer/json_budget.py), so every output parses and validates when the budget holds
    the schema's shortest output plus a few tokens. Without the steering many are cut mid-value."""
    from groundup.infer import json_budget
    from groundup.infer.structured import Grammars
    from schema_helpers import random_schema

    rng = random.Random(1)
    schemas = [random_schema(rng) for _ in range(40)]
    grammars = Grammars(gen.tokenizer, gen.model.cfg.vocab_size, gen.tokenizer.eot_id)
    shortest = [len(grammars.matcher(Structured("json", s)).closing_plan()) for s in schemas]

    def invalid() -> list[str]:
        bad = []
        for i, (schema, need) in enumerate(zip(schemas, shortest)):
            out = gen.complete(["{"], max_new_tokens=need + 5, temperature=1.0, seed=i,
                               structured=Structured("json", schema))[0]
            try:
                jsonschema.validate(json.loads(out.text), schema)
            except (json.JSONDecodeError, jsonschema.ValidationError):
                bad.append(f"{out.finish_reason}: {out.text}")
        return bad

    assert invalid() == []
    monkeypatch.setattr(json_budget.JsonBudget, "settle", lambda self, matcher, token, remaining: token)
    assert len(invalid()) >= 8  # the same requests, cut at max_tokens
