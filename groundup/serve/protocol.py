"""Request bodies as OpenAI and vLLM define them, validated, and the one error object every failure uses.

    req = parse(CompletionRequest, body_bytes)       # APIError (400) naming the field on any fault

Fields follow OpenAI's API reference (completions, chat completions) plus vLLM's sampling extras
(`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`) and its `/tokenize` and `/detokenize`.
Defaults are OpenAI's: temperature 1, top_p 1, n 1, completions max_tokens 16; chat max_tokens =
whatever the context leaves (capped by the server's limit). `seed` absent = a fresh random seed.

Refused with a 400 that names the field (OpenAI's `{"error": {"message", "type", "param", "code"}}`):
malformed JSON, a wrong type or out-of-range value, an unknown field (OpenAI's behaviour; a
did-you-mean hint), and what is accepted by OpenAI but not implemented here with a non-default
value (presence/frequency penalties, logit_bias, suffix, best_of > n, non-text message parts),
so that nothing is silently ignored. Tools: OpenAI's `tools`, `tool_choice` (none, auto, required, or
{"type": "function", "function": {"name"}}), `parallel_tool_calls`, assistant `tool_calls` and `role: "tool"`
messages; a tool_choice naming a function not in `tools` is a 400. Structured output: `response_format` (OpenAI: json_object,
json_schema), `structured_outputs` (vLLM: json, regex, choice, grammar, json_object) and vLLM's older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, on both endpoints.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import models_json_schema
from groundup.config import did_you_mean
from groundup.infer.structured import Structured


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage in every chunk


class _Sampling(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # -1 and 0: off
    min_p: float | None = Field(None, ge=0, lt=1)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    # Structured output: OpenAI's response_format, vLLM's structured_outputs, and vLLM's older guided_* names.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 16:
            raise ValueError("at most 16 stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    @model_validator(mode="after")
    def _unsupported(self):
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name} is not supported by this server (use repetition_penalty)")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        given = self.structured_options()
        if len(given) > 1:
            raise ValueError(f"{given[0]}: give one structured output option, not {' and '.join(given)}")
        return self

    def structured_options(self) -> list[str]:
        """The structured output fields given (response_format text is none)."""
        return [k for k in STRUCTURED_FIELDS if getattr(self, k) is not None and not (
            k == "response_format" and self.response_format.get("type") == "text")]

    def structured(self):
        """The structured output asked for (infer/structured.py's Structured), or None; ConfigError if malformed."""
        if self.response_format is not None:
            return Structured.from_response_format(self.response_format)
        if self.structured_outputs is not None:
            return Structured.from_request(self.structured_outputs)
        for kind in ("json", "regex", "choice", "grammar"):
            value = getattr(self, f"guided_{kind}")
            if value is not None:
                return Structured.from_request({kind: value})
        return None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _completion(self):
        if self.suffix:
            raise ValueError("suffix is not supported by this server")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported by this server (only best_of = n)")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is an empty list")
        return self


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # a JSON object, as text


class ToolCallMessage(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    refusal: str | None = None  # what an assistant message read back from a response carries
    tool_calls: list[ToolCallMessage] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _roles(self):
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant message makes tool calls")
        if self.role == "tool" and self.content is None:
            raise ValueError("content: a tool message carries the tool's result")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema for the arguments object
    strict: bool | None = None  # OpenAI's flag; with tool_choice required or named the arguments always follow it


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _chat(self):
        names = [t.function.name for t in self.tools or []]
        if self.tool_choice not in (None, "none", "auto") and not names:
            raise ValueError("tool_choice: a tool choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(f"tool_choice: no tool named {self.tool_choice.function.name!r} in tools "
                             f"({', '.join(names)})")
        if self.forces_tool_call and self.structured_options():
            raise ValueError("tool_choice: a required or named tool choice already constrains the output; "
                             "drop the structured output option")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs = true")
        return self

    @property
    def tool_mode(self) -> str:
        """none (no tools, or tool_choice none), auto, required, or named."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or "auto"

    @property
    def forces_tool_call(self) -> bool:
        return self.tool_mode in ("required", "named")

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # prompt: put the tokenizer's prefix first, as completions do
    add_generation_prompt: bool = True  # messages: end with the assistant's turn opening
    tools: list[Tool] | None = None  # messages: the tool definitions the chat template writes
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


def request_schemas(models: list[type[BaseModel]]) -> dict[str, dict]:
    """The JSON schema of each request model and of the models they use, by name, their references pointing
    into an OpenAPI document's `components/schemas` (the server's /openapi.json)."""
    _, top = models_json_schema([(m, "validation") for m in models], ref_template="#/components/schemas/{model}")
    return top["$defs"]


def parse(model_cls: type[BaseModel], raw: bytes):
    """A validated request from a body, or APIError(400) naming the first bad field."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise APIError(400, "the request body nests JSON arrays or objects too deeply") from None
    except ValueError as e:  # not JSON, not UTF-8, or an integer of more digits than Python converts
        reason = str(e).split("; use sys.set_int_max_str_digits", 1)[0]
        raise APIError(400, f"the request body is not valid JSON: {reason}") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        raise _error_from(e, model_cls) from None


def _error_from(e: ValidationError, model_cls: type[BaseModel]) -> APIError:
    errors = e.errors()
    err = errors[0]
    loc = [str(p) for p in err["loc"]]
    tag = next((i for i, p in enumerate(loc) if "[" in p or p in _TAGS), None)
    if tag is not None:  # a union: one error per alternative; name the field, not the alternatives
        loc = loc[:tag]
        err = {"type": "union", "msg": _UNION_MESSAGES.get(loc[-1], "invalid value") if loc else "invalid value",
               "input": None}
    param = ".".join(loc) or None
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        fields = model_cls.model_fields if len(loc) == 1 else {}
        return APIError(400, f"Unrecognized request argument supplied: {loc[-1]}{did_you_mean(loc[-1], fields)}",
                        param=param, code="unknown_parameter")
    if err["type"] == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if param is None:  # a check across fields: its message starts with the field it is about
        first = message.split(" ", 1)[0].rstrip(":")
        param = first if first in model_cls.model_fields else None
        return APIError(400, message, param=param, code="invalid_value")
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {json.dumps(got)[:80]})"
    return APIError(400, f"{param}: {message}{shown}", param=param, code="invalid_value")


_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "TextPart", "literal['none','auto','required']",
         "NamedToolChoice"}
_UNION_MESSAGES = {
    "prompt": "expected a string, a list of strings, a list of token ids or a list of token id lists",
    "stop": "expected a string or a list of strings",
    "content": "expected a string or a list of {\"type\": \"text\", \"text\": ...} parts (only text is supported)",
    "tool_choice": "expected none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
}
