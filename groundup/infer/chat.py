"""An interactive chat: history rendered with the chat format, trimmed to fit the context.

`ChatSession` keeps the conversation; `run_chat` is the terminal loop behind `groundup chat`
(lines in, streamed replies out; `/reset` forgets the conversation, `/exit` or end of input quits).
When the history no longer fits, the oldest exchanges are dropped (a system message stays), so
that the prompt leaves room for a reply of min(max_new_tokens, context / 2) tokens.
"""

from __future__ import annotations

from typing import IO, Iterator

from groundup.errors import DataError
from groundup.infer.engine import Generator
from groundup.infer.sampling import SamplingConfig

HELP = "commands: /reset (start a new conversation), /exit (quit), /help"


class ChatSession:
    def __init__(self, generator: Generator, sampling: SamplingConfig, system: str | None = None):
        self.generator, self.sampling = generator, sampling
        self.system = system
        self.messages: list[dict] = []
        self.dropped = 0  # messages dropped from the start of the history so far
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def reply(self, text: str) -> Iterator[str]:
        """Stream the assistant's answer to `text`; the exchange joins the history once complete."""
        self.messages.append({"role": "user", "content": text})
        try:
            self._trim_history()
        except DataError:
            self.messages.pop()
            raise
        pieces = []
        for piece in self.generator.chat(self.messages, self.sampling):
            pieces.append(piece)
            yield piece
        self.messages.append({"role": "assistant", "content": "".join(pieces)})

    def _trim_history(self) -> None:
        tok, context = self.generator.tokenizer, self.generator.cfg.max_seq_len
        room = context - min(self.sampling.max_new_tokens, context // 2)
        first = 1 if self.system else 0  # the system message is never dropped
        while True:
            ids, _ = tok.render_chat(self.messages, add_generation_prompt=True)
            if len(ids) <= room:
                return
            if len(self.messages) - first <= 1:  # only the new message left, and it alone is too long
                raise DataError(f"that message is {len(ids)} tokens with the chat markup; the model's context "
                                f"is {context} and keeps {context - room} for the reply: send something shorter")
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
