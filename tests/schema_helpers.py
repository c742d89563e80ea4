"""Random JSON schemas (nested objects, enums, arrays, numbers with ranges, bounded strings) and an instance of
each, for the structured-output tests and benchmarks."""

from __future__ import annotations

import random

WORDS = ["red", "blue", "green", "alpha", "beta", "north", "south", "cat", "dog", "tea"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """An object schema with 1-4 required properties of varied types."""
    props = {}
    for i in range(rng.randint(1, 4)):
        props[f"{rng.choice(WORDS)}_{i}"] = _value(rng, depth)
    return {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}


def _value(rng: random.Random, depth: int) -> dict:
    kinds = ["integer", "number", "enum", "string", "boolean", "array"] + (["object"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 100)}
    if kind == "number":
        lo = rng.uniform(-10, 10)
        return {"type": "number", "minimum": round(lo, 2), "maximum": round(lo + rng.uniform(0.5, 20), 2)}
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(2, 4))}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(3, 12)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        return {"type": "array", "items": _value(rng, depth + 1), "minItems": 0, "maxItems": rng.randint(1, 3)}
    return random_schema(rng, depth + 1)


def instance(schema: dict, rng: random.Random):
    """A value that validates against a schema `random_schema` made."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema["type"]
    if kind == "object":
        return {k: instance(v, rng) for k, v in schema["properties"].items()}
    if kind == "integer":
        return rng.randint(schema["minimum"], schema["maximum"])
    if kind == "number":
        return round(rng.uniform(schema["minimum"], schema["maximum"]), 2)
    if kind == "string":
        return rng.choice(WORDS)[: schema["maxLength"]]
    if kind == "boolean":
        return rng.random() < 0.5
    return [instance(schema["items"], rng) for _ in range(rng.randint(0, schema["maxItems"]))]
