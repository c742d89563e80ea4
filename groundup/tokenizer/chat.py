"""The chat format: a `messages` list rendered into token ids and an assistant-only loss mask.

    <|begin_of_text|><|system|>You are terse.<|end_of_turn|><|user|>2+2?<|end_of_turn|><|assistant|>4<|end_of_turn|>

Each message is its role token, its content encoded as plain text, and `<|end_of_turn|>`; the
conversation starts with `<|begin_of_text|>`; `add_generation_prompt` appends `<|assistant|>` so
a model continues with the assistant's reply and stops at `<|end_of_turn|>`. The loss mask is 1
on assistant content and on the end-of-turn token that closes it (the model must learn to stop),
0 everywhere else: the model is not trained to predict what users or the system say.

Content is encoded with `Tokenizer.encode`, so a message that spells `<|user|>` cannot forge a turn.
`CHAT_TEMPLATE` is the same format as a Jinja template for `tokenizer_config.json`; it renders the
same ids through `transformers` (whose tokenizer, unlike ours, does turn such literal spellings in
content into special tokens, as every Hugging Face chat template does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from groundup.errors import DataError

if TYPE_CHECKING:
    from groundup.tokenizer.tokenizer import Tokenizer

CHAT_ROLES = ROLES = ("system", "user", "assistant")

# Special-token spellings by role in the tokenizer; the order fixes their ids after the vocabulary.
SPECIAL_TOKENS = {
    "bos": "<|begin_of_text|>",
    "eot": "<|end_of_text|>",
    "pad": "<|pad|>",
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "end_of_turn": "<|end_of_turn|>",
}


def chat_template(names: dict[str, str] = SPECIAL_TOKENS) -> str:
    """The chat format as a Jinja template (the `chat_template` of `tokenizer_config.json`)."""
    roles = ", ".join(f"'{r}': '{names[r]}'" for r in ROLES)
    return (
        "{%- set role_tokens = {" + roles + "} -%}"
        "{{- '" + names["bos"] + "' -}}"
        "{%- for message in messages -%}"
        "{%- if message['role'] not in role_tokens -%}"
        "{{- raise_exception('chat role must be system, user or assistant, not ' + message['role']) -}}"
        "{%- endif -%}"
        "{{- role_tokens[message['role']] + message['content'] + '" + names["end_of_turn"] + "' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '" + names["assistant"] + "' -}}{%- endif -%}"
    )


def check_messages(messages: Any, where: str = "messages") -> None:
    """Raise DataError naming the message and reason unless `messages` is a valid chat."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise DataError(f"{where}: expected a non-empty list of {{role, content}} messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DataError(f"{where}[{i}]: expected an object with role and content, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise DataError(f"{where}[{i}]: role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise DataError(f"{where}[{i}]: content must be a string, got {type(content).__name__}")


def render_chat(tok: "Tokenizer", messages: Sequence[dict], add_generation_prompt: bool = False,
                ) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (same length) for a conversation; see the module docstring."""
    check_messages(messages)
    role_ids = {"system": tok.system_id, "user": tok.user_id, "assistant": tok.assistant_id}
    contents = tok.encode_batch([m["content"] for m in messages])
    ids, mask = [tok.bos_id], [0]
    for message, content in zip(messages, contents):
        learn = 1 if message["role"] == "assistant" else 0
        ids.append(role_ids[message["role"]])
        mask.append(0)
        ids.extend(content)
        ids.append(tok.end_of_turn_id)
        mask.extend([learn] * (len(content) + 1))
    if add_generation_prompt:
        ids.append(tok.assistant_id)
        mask.append(0)
    return ids, mask
