"""Shared by the tool tests: a tiny model made to write chosen replies, so a tool loop's turns are known."""

from __future__ import annotations

import pytest
import torch


class Script:
    """`model` made to write `replies` one after another, each followed by the end of its turn: every logits
    call (a turn's prefill, then each decode step) puts all the mass on the next token of the script. One
    conversation at a time: rows decoded together would share the script."""

    def __init__(self, model, tokenizer, replies: list[str] = ()):
        self.tok, self.tokens, self.step = tokenizer, [], 0
        computed = model.logits

        def logits(x):
            out = computed(x).fill_(-1e9)
            out[..., self.tokens[min(self.step, len(self.tokens) - 1)]] = 0.0
            self.step += 1
            return out

        model.logits = logits
        self.reply(*replies)

    def reply(self, *replies: str) -> None:
        """Write these replies next, from the next logits call on."""
        self.tokens = [t for r in replies for t in self.tok.encode(r) + [self.tok.end_of_turn_id]]
        self.step = 0


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a busy machine two threads that wait on each other make a tiny model's decode step
    30 times slower (300 ms instead of 10)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
