"""Hugging Face chat templates rendered exactly as transformers renders them, and the loss mask they imply.

    text = render_template(template, messages, add_generation_prompt=True, variables={"bos_token": "<s>", ...})
    ids, mask = render_chat_ids(template, messages, encode, add_generation_prompt=False, variables=...)
    more = continuation_text(template, messages, new_messages, variables=..., end_of_turn="<|im_end|>")

The environment is transformers' (`apply_chat_template`): Jinja2's ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loopcontrols extension, `raise_exception`, `strftime_now`,
a `tojson` filter that does not escape HTML, and the variables `messages`, `add_generation_prompt`,
`tools` and `documents` (None) plus the special-token strings (`bos_token`, `eos_token`, ...).
Message keys whose value is None are dropped first, as transformers does. A `{% generation %}`
block renders its body (transformers uses it only for its own assistant mask).

The loss mask needs no cooperation from the template: the assistant message i spans the tokens
between render(messages[:i]) + generation prompt and render(messages[:i+1]), i.e. its content and
the token(s) that close its turn. Each bound is the longest common token prefix of that partial
rendering with the full one, so a template that re-renders earlier turns differently (some strip
reasoning from old turns) still gets a sensible span rather than an error.

A continuation (what rendering new messages after a conversation adds, for a tool loop that appends
results to a running generation) is the text of the whole conversation past the text of the earlier one;
a template whose earlier text changes when messages follow is a DataError, since nothing can be appended.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Callable, Sequence

from groundup.errors import DataError


def check_chat_messages(messages: Any, where: str = "messages") -> list[dict]:
    """A non-empty list of objects with a string role (and string content when present), None values dropped."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise DataError(f"{where}: expected a non-empty list of {{role, content}} messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DataError(f"{where}[{i}]: expected an object with role and content, got {type(message).__name__}")
        message = {k: v for k, v in message.items() if v is not None}
        if not isinstance(message.get("role"), str):
            raise DataError(f"{where}[{i}]: role must be a string, got {message.get('role')!r}")
        if "content" in message and not isinstance(message["content"], (str, list)):
            raise DataError(f"{where}[{i}]: content must be a string, got {type(message['content']).__name__}")
        out.append(message)
    return out


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:  # pragma: no cover - jinja2 ships with every environment the tests run in
        raise DataError("rendering a Hugging Face chat template needs jinja2 (pip install jinja2)") from None

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise DataError(f"chat template: line {e.lineno}: {e.message}") from None


def render_template(template: str, messages: list[dict], add_generation_prompt: bool = False,
                    variables: dict[str, str] | None = None, tools: list[dict] | None = None) -> str:
    """The template's text for `messages` (already checked); DataError with the template's own message."""
    import jinja2

    compiled = _compile(template)
    try:
        return compiled.render(**(variables or {}), messages=messages, tools=tools or None, documents=None,
                               add_generation_prompt=add_generation_prompt)
    except jinja2.exceptions.TemplateError as e:
        raise DataError(f"chat template: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise DataError(f"chat template failed on these messages: {type(e).__name__}: {e}") from None


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def render_chat_ids(template: str, messages: Any, encode: Callable[[str], list[int]],
                    add_generation_prompt: bool = False, variables: dict[str, str] | None = None,
                    tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a conversation: `encode` tokenizes rendered text with specials recognised."""
    messages = check_chat_messages(messages)
    ids = encode(render_template(template, messages, add_generation_prompt, variables, tools))
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        try:
            before = encode(render_template(template, messages[:i], True, variables, tools)) if i else []
        except DataError:  # e.g. a template that reads messages[0] and cannot render an empty chat
            before = []
        through = encode(render_template(template, messages[: i + 1], False, variables, tools))
        start, end = _common_prefix(before, ids), _common_prefix(through, ids)
        mask[start:end] = [1] * max(0, end - start)
    return ids, mask


def continuation_text(template: str, messages: Any, new_messages: Any, add_generation_prompt: bool = True,
                      variables: dict[str, str] | None = None, tools: list[dict] | None = None,
                      end_of_turn: str | None = None) -> str:
    """The text rendering `new_messages` after `messages` adds (all of it when `messages` is empty).

    When `messages` ends with an assistant turn whose text ends in the `end_of_turn` spelling and then only
    whitespace (ChatML's "<|im_end|>\n"), that whitespace opens the continuation: a generation stops at the
    end-of-turn token, so it was never sampled. DataError when the template renders the earlier turns
    differently once `new_messages` follow (some drop the reasoning of old turns)."""
    new = check_chat_messages(new_messages, "new_messages")
    if not messages:
        return render_template(template, new, add_generation_prompt, variables, tools)
    old = check_chat_messages(messages)
    before = render_template(template, old, False, variables, tools)
    after = render_template(template, old + new, add_generation_prompt, variables, tools)
    if not after.startswith(before):
        at = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
        raise DataError(f"chat template: it re-renders earlier turns once new_messages follow (character {at}: "
                        f"{before[at:at + 40]!r} becomes {after[at:at + 40]!r}), so nothing can be appended to them")
    cut = len(before)
    if end_of_turn and old[-1]["role"] == "assistant":
        end = before.rfind(end_of_turn)
        if end >= 0 and not before[end + len(end_of_turn):].strip():
            cut = end + len(end_of_turn)
    return after[cut:]
