"""Token ids in, text out as it becomes final: incremental UTF-8, special tokens and stop strings.

A token may end in the middle of a multi-byte character, and the text just decoded may be the
start of a stop string; neither may be shown yet. `TextStream.push` returns only text that no
later token can change, so streamed pieces always concatenate to the final text:

    stream = TextStream(tok, stop_ids={tok.eot_id}, stop_strings=["\\n\\n"])
    for token in tokens:
        print(stream.push(token), end="")
        if stream.done:
            break
    print(stream.finish(), end="")
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from groundup.tokenizer import BaseTokenizer


class TextStream:
    def __init__(self, tokenizer: "BaseTokenizer", stop_ids: Iterable[int] = (), stop_strings: Iterable[str] = (),
                 skip_special: bool = True):
        self.tokenizer = tokenizer
        self.skip_special = skip_special  # False: other special tokens are shown, spelled out
        self.stop_ids = set(stop_ids)
        self.stop_strings = [s for s in stop_strings if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # decoded so far (cut at a stop string once one is found)
        self.emitted = 0  # characters of `text` already returned
        self.token_ids: list[int] = []  # generated ids, up to and including a stop token
        self.done = False
        self.finish_reason: str | None = None  # "stop" (a stop token or string), or set by the caller

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that became final."""
        if self.done:
            return ""
        self.token_ids.append(token_id)
        if token_id in self.stop_ids:
            self._stop()
            return self._take(len(self.text))
        if self.tokenizer.is_special(token_id) and self.skip_special:  # other special tokens show nothing
            return ""
        self.text += self._decoder.decode(self.tokenizer.id_to_bytes(token_id))
        return self._after_new_text()

    def finish(self, reason: str = "length") -> str:
        """End the stream (no more tokens); return what was held back."""
        piece = ""
        if not self.done:
            self.text += self._decoder.decode(b"", final=True)
            piece = self._after_new_text()  # the flushed text may complete a stop string
            if not self.done:
                self._stop(reason)
        return piece + self._take(len(self.text))

    def _stop(self, reason: str = "stop") -> None:
        self.done, self.finish_reason = True, reason

    def _after_new_text(self) -> str:
        longest = max((len(s) for s in self.stop_strings), default=0)
        if longest:
            # A stop string can only start where it would overlap the newly decoded text.
            search_from = max(0, self.emitted - longest + 1)
            hits = [i for i in (self.text.find(s, search_from) for s in self.stop_strings) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self._stop()
                return self._take(len(self.text))
        return self._take(len(self.text) - self._held_back())

    def _held_back(self) -> int:
        """Length of the longest end of `text` that could still grow into a stop string."""
        for n in range(min(len(self.text), max((len(s) for s in self.stop_strings), default=1) - 1), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return n
        return 0

    def _take(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        piece, self.emitted = self.text[self.emitted : upto], upto
        return piece
