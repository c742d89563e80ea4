"""GRPO's and RFT's multi-turn rollouts: the policy replies, calls tools, reads their results, goes on.

    runner = tool_runner(cfg.grpo.tools)                  # None when tool use is off ("")
    outs = roll_out(gen, prompts, runner, max_tool_calls=4, seed=7, max_new_tokens=64, logprobs=True)
    record = trajectory_record(prompt, outs[0])           # RFT's kept sample: the whole conversation

Each prompt is a chat (its `messages`) shown with the definitions its record's `tools` field holds, or
else the runner's, and rolls out through the engine's tool loop (infer/tool_loop.py): a ToolRollout
whose `generated` mask is True exactly on the ids the policy sampled. GRPO trains on those ids only
(rollout.py: the tool results and the turn tokens inserted around them are targets of nothing) and the
rewards judge the final answer (`.text`) with the record's fields. Row i samples with `seed + i`, as a
plain batch does, whichever prompts show other tools, so a rerun (a resumed step) is bit-exact.

An RFT sample kept is the conversation with the turns the rollout added (calls, results, the final
answer) and the tools it was shown: SFT renders it with the same chat format and trains on the
assistant's text and calls, never on results or definitions (tokenizer/chat.py's loss mask), which is
the `generated` mask of the rollout when the replies tokenize as the renderer does.
"""

from __future__ import annotations

from dataclasses import dataclass

from groundup.infer.tool_loop import ToolRollout, generate_with_tools
from groundup.tools import ToolResult, ToolRunner, resolve_tools


def tool_runner(spec: str) -> ToolRunner | None:
    """The runner of a `tools` config spec ("" = tool use off)."""
    return ToolRunner(resolve_tools(spec)) if spec else None


@dataclass
class _Shown:
    """A runner showing other definitions (a record's own `tools`): the calls still run on `runner`."""
    runner: ToolRunner
    tools: list[dict]

    def schemas(self) -> list[dict]:
        return self.tools

    def run(self, call) -> ToolResult:
        return self.runner.run(call)


def roll_out(gen, prompts, runner: ToolRunner, max_tool_calls: int, seed: int = 0, **sampling) -> list[ToolRollout]:
    """A ToolRollout of each prompt (chat prompts: `messages`, `tools`), row i sampled with `seed + i`.
    Consecutive rows showing the same definitions are one engine call (a batch's G rows of a prompt
    always are; a batch whose records carry no `tools` is a single call)."""
    outs: list[ToolRollout] = []
    start = 0
    while start < len(prompts):
        shown = prompts[start].tools
        end = start + 1
        while end < len(prompts) and prompts[end].tools == shown:
            end += 1
        run_on = runner if not shown or shown == runner.schemas() else _Shown(runner, shown)
        outs += generate_with_tools(gen, [p.messages for p in prompts[start:end]], run_on,
                                    max_tool_calls=max_tool_calls, seed=seed + start, **sampling)
        start = end
    return outs


def trajectory_record(prompt, out: ToolRollout) -> dict:
    """An SFT chat record of a kept rollout: the prompt's conversation, the turns added, the tools shown."""
    record = {"messages": [*prompt.messages, *out.messages]}
    if prompt.tools:
        record["tools"] = prompt.tools
    return record
