"""Structured output: decoding constrained to a JSON schema, any JSON object, a regex, a choice or a grammar.

    spec = Structured.from_request({"json": schema})             # vLLM's structured_outputs keys
    spec = Structured.from_response_format({"type": "json_schema", "json_schema": {"schema": schema}})
    grammars = Grammars(tokenizer, vocab_size=model.cfg.vocab_size, stop_id=tok.eot_id)   # once per tokenizer
    matcher = grammars.matcher(spec)     # one per sequence
    matcher.mask(logits_row)             # in place: every token the grammar cannot take next gets -inf
    matcher.accept(token)                # advance; after the grammar's end only the stop token is allowed

The grammar engine is llguidance (guidance-ai; the engine vLLM, SGLang and llama.cpp offer), chosen by
measured mask time per token on groundup's tokenizer and a 49K-token vocabulary against xgrammar and
outlines-core (benchmarks/grammar_engines.py; README, Serving). It also takes every format vLLM's
`structured_outputs` names (JSON schema, regex, choice, Lark or GBNF grammar) with no dependency of its
own, where outlines-core has no grammars and xgrammar needs transformers and triton.

The constrained sequence ends with the stop token the grammar allows once it is complete (the
tokenizer's end of text, or the chat format's end of turn): the engine's usual stop, so the text never
holds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from groundup.errors import ConfigError
from groundup.infer.json_budget import JsonBudget, TokenShapes
from groundup.tokenizer.tool_calls import CALL_CLOSE, CALL_OPEN

KINDS = ("json", "json_object", "regex", "choice", "grammar")
_SHIFTS = torch.arange(32, dtype=torch.int32)  # bit i of a 32-bit mask word is token 32 * word + i


@dataclass(frozen=True)
class Structured:
    kind: str  # json (a JSON schema), json_object (any object), regex, choice, grammar (Lark or GBNF)
    spec: Any = None  # the schema (dict), the pattern, the list of choices, or the grammar text

    @classmethod
    def from_request(cls, value: dict) -> "Structured":
        """vLLM's `structured_outputs` (also its older `guided_*` names): exactly one of json, regex, choice,
        grammar, json_object."""
        given = {k: v for k, v in value.items() if v is not None and k in KINDS}
        if len(given) != 1:
            raise ConfigError(f"structured_outputs: give exactly one of {', '.join(KINDS)} (got "
                              f"{', '.join(sorted(value)) or 'none'})", key="structured_outputs")
        kind, spec = next(iter(given.items()))
        if kind == "json" and isinstance(spec, str):
            spec = _json_value(spec, "structured_outputs.json")
        if kind == "json_object":
            return cls("json_object")
        return cls(kind, spec).checked()

    @classmethod
    def from_response_format(cls, value: dict) -> "Structured | None":
        """OpenAI's `response_format`: text (None), json_object, or json_schema with its `schema`."""
        kind = value.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls("json_object")
        if kind == "json_schema":
            schema = (value.get("json_schema") or {}).get("schema")
            if schema is None:
                schema = {"type": "object"}  # OpenAI accepts a json_schema without one
            return cls("json", schema).checked()
        raise ConfigError(f"response_format.type = {kind!r}: expected text, json_object or json_schema",
                          key="response_format")

    @classmethod
    def tool_calls(cls, tools: list[dict], name: str | None = None, parallel: bool = True,
                   tag_ids: tuple[int, int] | None = None) -> "Structured":
        """A grammar for tool calls as tokenizer/tool_calls.py writes them: one or more (only one when `name`
        is given or `parallel` is false) `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
        each name one of `tools` (or `name`) and its arguments valid against that function's `parameters`.
        `tag_ids`: the tokenizer's special tokens for the two tags (Qwen's), which plain text cannot spell."""
        chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
        if not chosen:
            raise ConfigError(f"tool_choice: no tool named {name!r} in tools", key="tool_choice")
        schema = {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                             "properties": {"name": {"const": fn["name"]},
                                            "arguments": fn.get("parameters") or {"type": "object"}}}
                            for fn in chosen],
                  # Exactly the separators call_text writes (json.dumps'): the text the template and SFT show.
                  "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
        opening, closing = (f"<[{tag_ids[0]}]>", f"<[{tag_ids[1]}]>") if tag_ids else (
            json.dumps(CALL_OPEN), json.dumps(CALL_CLOSE))
        repeat = ' ("\\n" call)*' if parallel and name is None else ""
        lark = (f"start: call{repeat}\ncall: {opening} \"\\n\" body \"\\n\" {closing}\n"
                f"body: %json {json.dumps(schema)}\n")
        return cls("grammar", lark)

    def validate(self) -> None:
        """Compile the constraint (no tokenizer needed): a ConfigError naming what is wrong, before any work."""
        import llguidance

        try:
            grammar = self.grammar()
        except ValueError as e:
            raise ConfigError(f"structured output {self.kind}: {e}", key=self.kind) from None
        error = llguidance.LLMatcher.validate_grammar(grammar)
        if error:
            raise ConfigError(f"structured output {self.kind}: {error}", key=self.kind)

    def checked(self) -> "Structured":
        kinds = {"json": dict, "regex": str, "choice": list, "grammar": str}
        if not isinstance(self.spec, kinds[self.kind]) or (self.kind == "choice" and (
                not self.spec or not all(isinstance(c, str) for c in self.spec))):
            expected = {"json": "a JSON schema object", "regex": "a pattern string", "grammar": "a grammar string",
                        "choice": "a non-empty list of strings"}[self.kind]
            raise ConfigError(f"structured output {self.kind}: expected {expected}", key=self.kind)
        return self

    def grammar(self) -> str:
        """llguidance's grammar for this constraint."""
        import llguidance

        # Compact JSON (no whitespace between tokens): a small model cannot spend its tokens on indentation.
        compact = {"whitespace_flexible": False}
        if self.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=compact)
        if self.kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(self.spec, defaults=compact)
        if self.kind == "choice":
            return llguidance.grammar_from("choice", json.dumps(self.spec))
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.spec)
        return llguidance.grammar_from("grammar", self.spec)


def _json_value(text: str, key: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{key}: not JSON ({e})", key=key) from None


def _llguidance():
    try:
        import llguidance
        import llguidance.torch  # noqa: F401  (the bitmask helpers)
    except ImportError:
        raise ConfigError("structured output needs llguidance: pip install 'groundup[serve]' (or llguidance)",
                          key="structured_outputs") from None
    return llguidance


class _Vocabulary:
    """A tokenizer as llguidance's TokenizerWrapper reads one: every id's bytes, the stop token, encoding."""

    def __init__(self, tokenizer, vocab_size: int, stop_id: int):
        self.tok = tokenizer
        self.eos_token_id, self.bos_token_id = stop_id, None
        n = tokenizer.vocab_size
        self.tokens = [tokenizer.id_to_bytes(i) for i in range(n)] + [b""] * (vocab_size - n)
        self.special_token_ids = sorted(tokenizer.special_token_ids)

    def __call__(self, text) -> list[int]:
        return self.tok.encode(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)


class Grammars:
    """Grammar matchers over one tokenizer and model vocabulary (the vocabulary is read once)."""

    def __init__(self, tokenizer, vocab_size: int, stop_id: int):
        llg = _llguidance()
        self.vocab_size, self.stop_id = vocab_size, stop_id
        vocabulary = _Vocabulary(tokenizer, vocab_size, stop_id)
        self.tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(vocabulary), n_vocab=vocab_size)
        self._grammars: dict[str, str] = {}
        self._token_bytes = vocabulary.tokens
        self._shapes = None  # json_budget.TokenShapes, made on the first JSON constraint

    def matcher(self, spec: Structured) -> "Matcher":
        llg = _llguidance()
        key = json.dumps([spec.kind, spec.spec], sort_keys=True)
        grammar = self._grammars.get(key)
        if grammar is None:
            try:
                grammar = spec.grammar()
            except ValueError as e:
                raise ConfigError(f"structured output {spec.kind}: {e}", key=spec.kind) from None
            self._grammars[key] = grammar
        matcher = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ConfigError(f"structured output {spec.kind}: {matcher.get_error()}", key=spec.kind)
        budget = None
        if spec.kind in ("json", "json_object"):  # JSON can be steered to close before max_tokens cuts it
            if self._shapes is None:
                self._shapes = TokenShapes(self._token_bytes)
            budget = JsonBudget(self._shapes, self.stop_id, None)
        return Matcher(matcher, self.vocab_size, budget)


class Matcher:
    """One sequence's position in its grammar."""

    def __init__(self, matcher, vocab_size: int, budget: JsonBudget | None = None):
        import llguidance.torch as llgt

        self._m, self._llgt, self.vocab_size = matcher, llgt, vocab_size
        self.bitmask = llgt.allocate_token_bitmask(1, vocab_size)
        self.budget = budget
        if budget is not None:
            budget.allowed_ids = self._allowed_ids

    def mask(self, logits: torch.Tensor) -> None:
        """Set to -inf, in place, the logits (V,) of every token the grammar does not allow next (only the
        next token of the closing plan, once the sequence follows one)."""
        if self.budget is not None and self.budget.forced:
            keep = logits[self.budget.forced[0]].clone()
            logits.fill_(float("-inf"))
            logits[self.budget.forced[0]] = keep if torch.isfinite(keep) else 0.0
            return
        self._llgt.fill_next_token_bitmask(self._m, self.bitmask, 0)
        bits = self.bitmask[0].to(logits.device)
        allowed = ((bits[:, None] >> _SHIFTS.to(logits.device)) & 1).reshape(-1)[: logits.shape[-1]].bool()
        logits.masked_fill_(~allowed, float("-inf"))

    def settle(self, token: int, remaining: int) -> int:
        """The token to take for the sampled `token` with `remaining` tokens left (this one included): itself,
        or for JSON the next token of the closing plan once the sampled one would leave no way to finish in
        time (json_budget.py)."""
        return token if self.budget is None else self.budget.settle(self._m, token, remaining)

    def closing_plan(self, limit: int = 100_000) -> list[int] | None:
        """JSON only: the tokens that would close the output from here, stop token included (None: none
        within `limit`); from the start, the shortest output the schema allows, as the greedy plan finds it."""
        return self.budget.plan(self._m, limit) if self.budget is not None else None

    def accept(self, token: int) -> None:
        self._m.consume_token(token)
        if self.budget is not None:
            self.budget.advance(token)

    def _allowed_ids(self, matcher) -> np.ndarray:
        """The token ids `matcher` allows next."""
        bitmask = self._llgt.allocate_token_bitmask(1, self.vocab_size)
        self._llgt.fill_next_token_bitmask(matcher, bitmask, 0)
        bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[: self.vocab_size]
        return np.flatnonzero(bits)

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None
