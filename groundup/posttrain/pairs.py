"""Preference data as TRL users have it, tokenized into (prompt, completion) token lists.

    pairs, report = read_pairs(files, tok, max_len)        # DPO: prompt / chosen / rejected
    singles, report = read_feedback(files, tok, max_len)   # KTO: prompt / completion / label

Accepted (JSONL or Parquet, through groundup.data's one reader):
- explicit prompt: `prompt` with `chosen` and `rejected` (KTO: `completion` and a boolean `label`),
  each plain text or a list of messages (the prompt's, then the assistant's);
- TRL's implicit prompt: `chosen` and `rejected` are whole conversations (or texts) that share their
  beginning; the shared messages (or characters) are the prompt.
Messages are rendered with the tokenizer's chat template (the completion ends with the end-of-turn
token, which is learned); plain texts are the prompt after the document prefix and the completion
followed by end-of-text. Tool use as records.py reads it: a record-level `tools` list reaches the
template, the prompt may hold calls and results, and a completion's assistant messages may call tools
(their calls are part of what is compared and learned; a completion never holds tool results).

Never a crash of a long run: identical chosen and rejected, an empty completion, a record of no
known shape are skipped and counted with their `file:line`; a prompt that leaves no room in the
context loses tokens from its start (counted), and a completion that alone overflows it is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from groundup.data.hashing import document_score
from groundup.data.readers import ReadStats, iter_records
from groundup.errors import DataError
from groundup.posttrain.records import BadRecord, parse_messages, parse_tools


@dataclass
class Pair:
    index: int
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    meta: dict = field(default_factory=dict)


@dataclass
class Feedback:
    index: int
    prompt: list[int]
    completion: list[int]
    label: bool
    meta: dict = field(default_factory=dict)


@dataclass
class PairsReport:
    records: int = 0
    kept: int = 0
    truncated_prompts: int = 0
    skipped: list[str] = field(default_factory=list)  # "file:line: reason"
    read: ReadStats = field(default_factory=ReadStats)

    def to_dict(self) -> dict:
        return {"records": self.records, "kept": self.kept, "truncated_prompts": self.truncated_prompts,
                "skipped": len(self.skipped), "skipped_examples": self.skipped[:10], "read": self.read.to_dict()}


def _render(tok, prompt, completion, tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of one prompt and one completion, text or messages (`tools`: the
    record's tool definitions, for messages)."""
    if isinstance(prompt, str) and isinstance(completion, str):
        if not completion:
            raise BadRecord("the completion is empty")
        return list(tok.prefix_ids) + tok.encode(prompt), tok.encode(completion) + [tok.eot_id]
    if isinstance(prompt, list) and isinstance(completion, list):
        p, c = parse_messages(prompt, "prompt"), parse_messages(completion, "completion")
        if not c or any(m["role"] != "assistant" for m in c) or not any(m["content"] or m.get("tool_calls")
                                                                         for m in c):
            raise BadRecord("the completion must be non-empty assistant messages")
        try:
            prompt_ids, _ = tok.render_chat(p, add_generation_prompt=True, tools=tools)
            full, _ = tok.render_chat(p + c, tools=tools)
        except DataError as e:  # e.g. a Hugging Face template that refuses these messages
            raise BadRecord(str(e)) from None
        if full[: len(prompt_ids)] != prompt_ids:
            raise BadRecord("the chat template renders the prompt differently inside the conversation")
        return prompt_ids, full[len(prompt_ids):]
    raise BadRecord("prompt and completion must both be text or both be lists of messages")


def _implicit_prompt(chosen, rejected):
    """TRL's implicit prompt: the shared beginning of two conversations (or texts)."""
    if isinstance(chosen, list) and isinstance(rejected, list):
        n = 0
        while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
            n += 1
        return chosen[:n], chosen[n:], rejected[n:]
    if isinstance(chosen, str) and isinstance(rejected, str):
        n = 0
        while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
            n += 1
        n = chosen.rfind(" ", 0, n) + 1 if n < len(chosen) and n else n  # split at a word boundary
        return chosen[:n], chosen[n:], rejected[n:]
    raise BadRecord("'chosen' and 'rejected' must both be texts or both be lists of messages")


def _fit(prompt: list[int], completions: Sequence[list[int]], max_len: int, report: PairsReport) -> list[int]:
    """The prompt, cut from its start so that prompt + the longest completion fits `max_len` tokens."""
    room = max_len - max(len(c) for c in completions)
    if room < 1:
        raise BadRecord(f"a completion of {max(len(c) for c in completions)} tokens leaves no room in a context of "
                        f"{max_len}")
    if len(prompt) > room:
        report.truncated_prompts += 1
        return prompt[-room:]
    return prompt


def _meta(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("_") and k not in ("prompt", "chosen", "rejected",
                                                                                    "completion", "label", "tools")}


def read_pairs(paths, tok, max_len: int) -> tuple[list[Pair], PairsReport]:
    report, pairs = PairsReport(), []
    for record in iter_records(paths, report.read, require_text=False):
        report.records += 1
        where = record.get("_where", "?")
        try:
            if "chosen" not in record or "rejected" not in record:
                raise BadRecord("expected 'chosen' and 'rejected' (and 'prompt', unless implicit)")
            prompt, chosen, rejected = record.get("prompt"), record["chosen"], record["rejected"]
            if prompt is None:
                prompt, chosen, rejected = _implicit_prompt(chosen, rejected)
            if chosen == rejected:
                raise BadRecord("'chosen' and 'rejected' are identical")
            tools = parse_tools(record.get("tools"))
            p, c = _render(tok, prompt, chosen, tools)
            p2, r = _render(tok, prompt, rejected, tools)
            if c == r:
                raise BadRecord("'chosen' and 'rejected' tokenize identically")
            pairs.append(Pair(len(pairs), _fit(p, [c, r], max_len, report), c, r, _meta(record)))
        except BadRecord as e:
            report.skipped.append(f"{where}: {e}")
    report.kept = len(pairs)
    return pairs, report


def read_feedback(paths, tok, max_len: int) -> tuple[list[Feedback], PairsReport]:
    report, singles = PairsReport(), []
    for record in iter_records(paths, report.read, require_text=False):
        report.records += 1
        where = record.get("_where", "?")
        try:
            if "completion" not in record or not isinstance(record.get("label"), bool):
                raise BadRecord("expected 'prompt', 'completion' and a boolean 'label'")
            p, c = _render(tok, record.get("prompt", ""), record["completion"], parse_tools(record.get("tools")))
            singles.append(Feedback(len(singles), _fit(p, [c], max_len, report), c, record["label"], _meta(record)))
        except BadRecord as e:
            report.skipped.append(f"{where}: {e}")
    report.kept = len(singles)
    return singles, report


def split_heldout(items: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, held out): records marked split = "heldout" are held out; otherwise a hash of the prompt decides."""

    marked = any("split" in x.meta for x in items)
    train, held = [], []
    for x in items:
        if marked:
            out = x.meta.get("split") == "heldout"
        else:
            out = document_score(",".join(map(str, x.prompt)), seed) < fraction
        (held if out else train).append(x)
    return train, held
