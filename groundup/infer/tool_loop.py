"""Generation that runs tools: the model replies, its calls run, their results join the conversation, it goes on.

    runner = ToolRunner(resolve_tools("calculator,python"))
    rollouts = generate_with_tools(gen, [[{"role": "user", "content": "What is 37 * 91?"}]], runner,
                                   max_tool_calls=4, seed=0, max_new_tokens=128, temperature=0.7)
    rollouts[0].text, rollouts[0].messages     # the final answer; the turns added (calls, results, answer)

Each conversation is rendered with the tools' definitions (`tokenizer.render_chat(..., tools=)`) and every
row still going is generated together through the engine (`Generator.complete_ids`), one assistant turn
per round: a row stops at the end of its turn (the tokenizer's stop ids). The reply's calls are read from
its text (`parse_tool_calls`), run (`ToolRunner.run`, which never raises: a failing tool is an error result
the model reads), and the tool turn plus the next generation prompt are appended as the tokenizer renders
them after the conversation so far (`tokenizer.render_continuation`); then the row generates again. At
most `max_tool_calls` calls run per conversation (a reply's calls past the budget get an error result
saying so); after the budget is spent the model has one last turn, and calls in it are not run
(finish_reason "tool_calls").

What a rollout promises (ToolRollout):
- `prompt_ids + token_ids` is the whole sequence the model saw, in order; `generated[k]` is True exactly on
  the ids the model sampled (the only ones a trainer may train on) and False on inserted ones (tool
  results, turn tokens); `logprobs[k]` is the sampled id's log-prob, 0.0 on inserted ids. When every reply
  is tokenized as the chat renderer would tokenize it, `prompt_ids + token_ids` equals rendering the
  conversation plus `messages`; otherwise the ids are what was really sampled, which is what training needs.
- Seeds: row i samples round r (its r-th assistant turn) with `seed + i + r * ROUND_STRIDE`, its own
  whichever other rows are still running, so round 0 is `seed + i` as in every engine call, a row
  decodes as it would alone, and a rerun (a resumed GRPO step) is bit-exact.
- A row ends with finish_reason "stop" (a final reply), "tool_calls" (calls after the budget), or "length":
  a reply cut by max_new_tokens (which applies to each turn) or by the context, a prompt that leaves no
  room, or tool results that would not fit in the context (then they are not appended, and the call
  message is the last one). A full context never raises. A reply that ends at a stop id other than the
  end of turn (the end-of-text token) is not continued: its calls are not run, and it ends as the engine
  says ("stop").
- `on_event(row, kind, payload)`, when given, sees the turns as they happen, round by round: ("text",
  content) for each reply's text, then ("call", ToolCall) for each call the round's replies made, then,
  once the round's calls have run (calls to sandboxed tools at the same time: ToolRunner.run_many),
  ("result", ToolResult) for each, in the same order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Sequence

from groundup.config import fail
from groundup.errors import DataError
from groundup.infer.sampling import SamplingConfig
from groundup.tokenizer.tool_calls import parse_tool_calls
from groundup.tools import ToolResult, ToolRunner

ROUND_STRIDE = 1_000_003  # seed distance between rounds: past any batch, so no two (row, round) share a seed


@dataclass
class ToolRollout:
    prompt_ids: list[int]  # the conversation rendered with the tools, up to the first generation prompt
    token_ids: list[int] = field(default_factory=list)  # everything after the prompt, sampled and inserted, in order
    generated: list[bool] = field(default_factory=list)  # per id: True = sampled by the model
    logprobs: list[float] | None = None  # with SamplingConfig.logprobs: per id, 0.0 on inserted ids
    messages: list[dict] = field(default_factory=list)  # the turns added: calls, tool results, the final reply
    text: str = ""  # the final reply's content
    tool_calls: int = 0  # calls run
    tool_errors: int = 0  # results that were errors (failed, timed out, refused, cut, or over the budget)
    finish_reason: str = "stop"  # "stop", "tool_calls" or "length"


def round_seed(seed: int, row: int, round_: int) -> int:
    """The seed row `row` samples its `round_`-th assistant turn with."""
    return seed + row + round_ * ROUND_STRIDE


@dataclass
class _Row:
    rollout: ToolRollout
    ids: list[int]  # prompt_ids + token_ids: what the next round continues
    history: list[dict]  # the conversation so far, for render_continuation
    round: int = 0
    made: int = 0  # calls the model wrote, run or not: numbers their ids
    done: bool = False


def _over_budget(limit: int) -> ToolResult:
    message = f"not run: this conversation has used all {limit} of its tool calls; answer with what you have"
    return ToolResult(f"Error: {message}", False, message, 0.0)


def generate_with_tools(gen, conversations: Sequence[Sequence[dict]], runner: ToolRunner, *,
                        max_tool_calls: int = 4, seed: int = 0,
                        on_event: Callable[[int, str, object], None] | None = None,
                        tools: list[dict] | None = None, sampling: SamplingConfig | None = None,
                        **options) -> list[ToolRollout]:
    """One ToolRollout per conversation (see the module docstring). `gen`: an engine Generator; `runner`: a
    ToolRunner (or any object with `schemas()` and `run(call)`); `tools`: the definitions the model is shown
    (default `runner.schemas()`; a record's own, its calls still run on `runner`); `sampling` and `options`:
    SamplingConfig and its fields (max_new_tokens is per turn; `seed` here wins)."""
    if not isinstance(max_tool_calls, int) or max_tool_calls < 0:
        fail("max_tool_calls", max_tool_calls, "an integer >= 0 (0: no tool runs)")
    # The parser must see the call tags whatever kind of token they are (Qwen's are special), and the
    # loop itself keeps every row inside the context, so the engine never truncates a prompt.
    cfg = dataclasses.replace(SamplingConfig.make(sampling, **options), seed=seed, overflow="error",
                              skip_special_tokens=False)
    tok, context = gen.tokenizer, gen.cfg.max_seq_len
    tools = runner.schemas() if tools is None else tools
    rows: list[_Row] = []
    for i, conversation in enumerate(conversations):
        try:
            prompt = tok.render_chat(list(conversation), add_generation_prompt=True, tools=tools)[0]
        except DataError as e:
            raise DataError(f"conversation {i}: {e}") from None
        rollout = ToolRollout(prompt_ids=list(prompt), logprobs=[] if cfg.logprobs else None)
        row = _Row(rollout, list(prompt), list(conversation))
        if len(prompt) >= context:  # no room for one token
            rollout.finish_reason, row.done = "length", True
        rows.append(row)

    while True:
        active = [i for i, r in enumerate(rows) if not r.done]
        if not active:
            return [r.rollout for r in rows]
        completions = gen.complete_ids([rows[i].ids for i in active], cfg,
                                       seeds=[round_seed(seed, i, rows[i].round) for i in active])
        turns = [(i, _read_reply(i, rows[i], c, tok, max_tool_calls, on_event)) for i, c in zip(active, completions)]
        turns = [(i, turn) for i, turn in turns if turn is not None]
        # Every call of the round runs together (sandboxed ones at the same time: ToolRunner.run_many).
        jobs = [(i, k, call) for i, (_, calls, budget) in turns for k, call in enumerate(calls) if k < budget]
        if on_event:
            for i, (_, calls, _) in turns:
                for call in calls:
                    on_event(i, "call", call)
        ran = dict(zip([(i, k) for i, k, _ in jobs], _run_all(runner, [call for _, _, call in jobs])))
        for i, (message, calls, budget) in turns:
            # A call past the budget is not run, and the model reads why.
            results = [ran[(i, k)] if k < budget else _over_budget(max_tool_calls) for k in range(len(calls))]
            if on_event:
                for result in results:
                    on_event(i, "result", result)
            rows[i].rollout.tool_calls += min(budget, len(calls))
            _append_results(rows[i], message, calls, results, tok, tools, context)


def _run_all(runner, calls: list) -> list[ToolResult]:
    """A ToolRunner runs them with run_many; any other runner (an object with `schemas` and `run`) in turn."""
    return runner.run_many(calls) if isinstance(runner, ToolRunner) else [runner.run(call) for call in calls]


def _append(row: _Row, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
    rollout = row.rollout
    row.ids += ids
    rollout.token_ids += ids
    rollout.generated += [sampled] * len(ids)
    if rollout.logprobs is not None:
        rollout.logprobs += list(logprobs) if sampled and logprobs is not None else [0.0] * len(ids)


def _read_reply(i: int, row: _Row, c, tok, max_tool_calls: int, on_event):
    """Take one reply into the row. None when it ends the row; else (message, calls, how many may run)."""
    rollout = row.rollout
    _append(row, c.token_ids, True, c.logprobs)
    content, calls = parse_tool_calls(c.text)
    # Only a reply closed as the chat format closes a turn is continued: one that ended at another stop id
    # (the end of the document) is not a turn the renderer would write, so its calls are not run.
    turn_end = tok.stop_ids if tok.end_of_turn_id is None else {tok.end_of_turn_id}
    at_turn_end = c.finish_reason == "stop" and bool(c.token_ids) and c.token_ids[-1] in turn_end
    if calls:
        content = content.removesuffix("\n")  # the line break the format writes before a call
        for call in calls:  # deterministic ids: a rerun renders the same conversation
            call.id, row.made = f"call_{row.made}", row.made + 1
    if content and on_event:
        on_event(i, "text", content)
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [call.to_openai() for call in calls]
    budget = max_tool_calls - rollout.tool_calls
    if not calls or not at_turn_end or budget <= 0:
        rollout.messages.append(message)
        rollout.text = content
        rollout.finish_reason = "tool_calls" if calls and at_turn_end else c.finish_reason
        row.done = True
        return None
    return message, calls, budget


def _append_results(row: _Row, message: dict, calls: list, results: list[ToolResult], tok, tools: list[dict],
                    context: int) -> None:
    """The call message, its results and the next generation prompt, when they fit in the context."""
    rollout = row.rollout
    rollout.tool_errors += sum(not r.ok for r in results)
    results = [{"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.content}
               for call, result in zip(calls, results)]
    history = [*row.history, message]
    inserted = tok.render_continuation(history, results, add_generation_prompt=True, tools=tools)
    rollout.messages.append(message)
    if len(row.ids) + len(inserted) >= context:  # the results and one more token would not fit
        rollout.finish_reason, row.done = "length", True
        return
    _append(row, inserted, False)
    rollout.messages += results
    row.history = history + results
    row.round += 1
