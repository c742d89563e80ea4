"""An interactive chat: history rendered with the chat format, trimmed to fit the context.

`ChatSession` keeps the conversation; `run_chat` is the terminal loop behind `groundup chat`
(lines in, streamed replies out; `/reset` forgets the conversation, `/exit` or end of input quits).
When the history no longer fits, the oldest exchanges are dropped (a system message stays), so
that the prompt leaves room for a reply of min(max_new_tokens, context / 2) tokens.

With a `ToolRunner` (`groundup chat --tools calculator`), a reply runs through the tool loop
(tool_loop.py: the model's call is run, its result appended, and the model continues, up to
`max_tool_calls`), and each call and result is shown as it happens, `show_event`'s way:

    assistant> [calculator] {"expression": "7 * 8"}
    -> 56
    7 * 8 = 56.

The calls and results join the history with the reply, so the next turn sees them; an exchange is
dropped whole (a tool result never outlives its call).
"""

from __future__ import annotations

from typing import IO, Callable, Iterator

from groundup.errors import DataError
from groundup.infer.engine import Generator
from groundup.infer.sampling import SamplingConfig
from groundup.infer.tool_loop import generate_with_tools

HELP = "commands: /reset (start a new conversation), /exit (quit), /help"


def show_event(kind: str, payload) -> str:
    """How a tool loop's event reads in a terminal: `[name] arguments` for a call, `-> result` for its result
    (`-> Error: ...` when it failed), the reply's text as it is."""
    if kind == "call":
        return f"[{payload.name}] {payload.arguments}\n"
    if kind == "result":
        return f"-> {payload.content}\n"
    return payload


class EventPrinter:
    """A tool loop's `on_event` that writes each event as `show_event` spells it, a call always on a line of
    its own (a reply's text before its call does not end with a line break)."""

    def __init__(self, write: Callable[[str], None]):
        self.write, self.line_start = write, True

    def __call__(self, row: int, kind: str, payload) -> None:
        text = show_event(kind, payload)
        if kind == "call" and not self.line_start:
            text = "\n" + text
        if text:
            self.write(text)
            self.line_start = text.endswith("\n")


class ChatSession:
    def __init__(self, generator: Generator, sampling: SamplingConfig, system: str | None = None,
                 runner=None, max_tool_calls: int = 4):
        """`runner`: a tools.ToolRunner whose tools the model may call (None: plain chat)."""
        self.generator, self.sampling = generator, sampling
        self.system = system
        self.runner, self.max_tool_calls = runner, max_tool_calls
        self.messages: list[dict] = []
        self.dropped = 0  # messages dropped from the start of the history so far
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def _ask(self, text: str) -> None:
        """The user's message joins the history, the oldest exchanges leaving to make room (none if it cannot fit)."""
        self.messages.append({"role": "user", "content": text})
        try:
            self._trim_history()
        except DataError:
            self.messages.pop()
            raise

    def reply(self, text: str) -> Iterator[str]:
        """Stream the assistant's answer to `text`; the exchange joins the history once complete."""
        self._ask(text)
        pieces = []
        for piece in self.generator.chat(self.messages, self.sampling):
            pieces.append(piece)
            yield piece
        self.messages.append({"role": "assistant", "content": "".join(pieces)})

    def reply_with_tools(self, text: str, show: Callable[[str], None]) -> str:
        """The final answer to `text` after the tool loop; `show` gets each call, result and piece of text as
        it happens (`show_event`). The calls, results and answer join the history."""
        self._ask(text)
        rollout = generate_with_tools(self.generator, [list(self.messages)], self.runner,
                                      max_tool_calls=self.max_tool_calls, seed=self.sampling.seed,
                                      on_event=EventPrinter(show), sampling=self.sampling)[0]
        self.messages.extend(rollout.messages)
        return rollout.text

    def _trim_history(self) -> None:
        tok, context = self.generator.tokenizer, self.generator.cfg.max_seq_len
        room = context - min(self.sampling.max_new_tokens, context // 2)
        first = 1 if self.system else 0  # the system message is never dropped
        tools = self.runner.schemas() if self.runner is not None else None
        while True:
            ids, _ = tok.render_chat(self.messages, add_generation_prompt=True, tools=tools)
            if len(ids) <= room:
                return
            if len(self.messages) - first <= 1:  # only the new message left, and it alone is too long
                raise DataError(f"that message is {len(ids)} tokens with the chat markup; the model's context "
                                f"is {context} and keeps {context - room} for the reply: send something shorter")
            del self.messages[first]
            self.dropped += 1
            while len(self.messages) - first > 1 and self.messages[first]["role"] != "user":  # the exchange, whole
                del self.messages[first]
                self.dropped += 1


def run_chat(session: ChatSession, lines: IO[str], out: IO[str], prompt: str = "you> ") -> int:
    """The terminal loop; returns the number of replies given."""
    print(f"chat with {session.generator.cfg.name} (context {session.generator.cfg.max_seq_len} tokens). {HELP}",
          file=out, flush=True)
    replies = 0
    while True:
        out.write(prompt)
        out.flush()
        line = lines.readline()
        if not line:  # end of input
            out.write("\n")
            break
        text = line.rstrip("\n")
        command = text.strip().lower()
        if not command:
            continue
        if command in ("/exit", "/quit"):
            break
        if command == "/reset":
            session.reset()
            print("(conversation reset)", file=out, flush=True)
            continue
        if command == "/help":
            print(HELP, file=out, flush=True)
            continue
        before = session.dropped
        out.write("assistant> ")
        try:
            if session.runner is not None:
                session.reply_with_tools(text, lambda piece: (out.write(piece), out.flush()))
            else:
                for piece in session.reply(text):
                    out.write(piece)
                    out.flush()
        except DataError as e:
            print(f"(error: {e})", file=out, flush=True)
            continue
        out.write("\n")
        if session.dropped > before:
            print(f"(dropped the {session.dropped - before} oldest messages to stay within the context)",
                  file=out, flush=True)
        replies += 1
    return replies
