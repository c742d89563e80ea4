"""JSON that ends within its token budget: a constrained sequence near `max_tokens` is steered to close.

A grammar mask guarantees that every token keeps the output a prefix of valid JSON, not that the output
is complete when the budget runs out: a model that writes `3.14159...` digit after digit, or opens one
more nested object, is cut at `max_tokens` mid-value (OpenAI's API answers such a request with
`finish_reason: "length"` and a truncated string). Here the sequence stays free while it can still finish:
once fewer than `WINDOW` tokens are left, after each sampled token a plan is made on a copy of the
grammar matcher, the shortest way to close found greedily (close the open string, end the number, close
the innermost object or array, give each required value its cheapest form), and if the sampled token
would leave no plan that fits the tokens still left, the sequence follows the plan made before it
instead. The output then always parses and validates when the schema's own minimum fits the budget.

The greedy step ranks the tokens the grammar allows by what they do to the JSON's lexical state, read
from their bytes: the nesting depth (open objects and arrays, plus one inside a string) after the token,
then whether the token ends the value it is in (a quote, a comma, a colon, a bracket), then the longest
token inside a string (fewest steps to a string's end) and the shortest outside one. A token holding a
backslash is never chosen (an escape would make the byte scan ambiguous).
"""

from __future__ import annotations

import numpy as np

WINDOW = 48  # plan again only when fewer than the last plan's length + WINDOW tokens are left
_OPEN, _CLOSE, _ENDS = b"{[", b"}]", b",:"


def scan(data: bytes, in_string: bool, depth: int, escaped: bool = False) -> tuple[bool, int, bool, bool]:
    """The JSON lexical state after `data`: (in a string, depth, an escape pending, the bytes ended a value)."""
    ended = False
    for ch in data:
        if in_string:
            if escaped:
                escaped = False
            elif ch == 0x5C:  # backslash
                escaped = True
            elif ch == 0x22:  # closing quote
                in_string, ended = False, True
        elif ch == 0x22:
            in_string, ended = True, True
        elif ch in _OPEN:
            depth, ended = depth + 1, True
        elif ch in _CLOSE:
            depth, ended = depth - 1, True
        elif ch in _ENDS:
            ended = True
    return in_string, depth, escaped, ended


class TokenShapes:
    """Per token id, what its bytes do to the lexical state, from outside and from inside a string."""

    def __init__(self, token_bytes: list[bytes]):
        self.bytes = token_bytes
        n = len(token_bytes)
        self.depth = np.zeros((2, n), dtype=np.int32)  # depth change, [start outside, start inside a string]
        self.ends_in_string = np.zeros((2, n), dtype=np.int32)
        self.ends_value = np.zeros((2, n), dtype=bool)
        self.length = np.array([len(b) for b in token_bytes], dtype=np.int32)
        self.usable = np.array([bool(b) and 0x5C not in b for b in token_bytes], dtype=bool)
        for t, data in enumerate(token_bytes):
            for start in (0, 1):
                in_string, depth, _, ended = scan(data, bool(start), 0)
                self.depth[start, t], self.ends_in_string[start, t], self.ends_value[start, t] = depth, in_string, ended

    def ranked(self, allowed: np.ndarray, in_string: bool, depth: int, k: int = 4) -> list[int]:
        """The `k` allowed tokens (ids in `allowed`) that bring the JSON closest to its end, best first."""
        ids = allowed[self.usable[allowed]]
        if ids.size == 0:
            ids = allowed
        s = int(in_string)
        nesting = depth + self.depth[s, ids] + self.ends_in_string[s, ids]
        length = -self.length[ids] if in_string else self.length[ids]
        order = np.lexsort((ids, length, ~self.ends_value[s, ids], nesting))  # last key sorts first
        return ids[order[:k]].tolist()

    def progresses(self, allowed: np.ndarray, in_string: bool, depth: int) -> bool:
        """Whether a token in `allowed` ends the current value or closes something."""
        s = int(in_string)
        nesting = depth + self.depth[s, allowed] + self.ends_in_string[s, allowed]
        return bool(np.any(self.ends_value[s, allowed]) or np.any(nesting < depth + s))


class JsonBudget:
    """One sequence's lexical state and its closing plan (with `Matcher` in structured.py)."""

    def __init__(self, shapes: TokenShapes, stop_id: int, allowed_ids):
        self.shapes, self.stop_id, self.allowed_ids = shapes, stop_id, allowed_ids
        self.state = (False, 0, False)  # in a string, depth, escape pending
        self.forced: list[int] = []  # the plan being followed: every token to the stop token
        self.need: int | None = None  # tokens the last plan needed: no new plan while far more are left

    def advance(self, token: int) -> None:
        if self.forced and self.forced[0] == token:
            self.forced.pop(0)
        self.state = self._state_after(token)

    def settle(self, matcher, token: int, remaining: int) -> int:
        """The token to take instead of the sampled `token` (`remaining`: tokens left, this one included)."""
        if self.forced:
            return self.forced[0]
        if self.need is not None and remaining > self.need + WINDOW:
            return token
        after = matcher.deep_copy()
        if after.consume_token(token):
            plan = self._plan(after, self._state_after(token), remaining - 1)
            if plan is not None:
                self.need = len(plan) + 1
                return token
        plan = self._plan(matcher.deep_copy(), self.state, remaining)
        if plan is None:  # no closing fits any more (the schema's minimum is longer): leave the model to it
            self.need = 0
            return token
        self.forced = plan
        return plan[0]

    def plan(self, matcher, limit: int) -> list[int] | None:
        """The closing plan from where `matcher` is now (left as it is), at most `limit` tokens, or None."""
        return self._plan(matcher.deep_copy(), self.state, limit)

    def _state_after(self, token: int) -> tuple[bool, int, bool]:
        in_string, depth, escaped = self.state
        in_string, depth, escaped, _ = scan(self.shapes.bytes[token], in_string, depth, escaped)
        return in_string, depth, escaped

    def _plan(self, m, state, limit: int) -> list[int] | None:
        """Tokens from `m` (consumed as it goes) to and including the stop token, at most `limit`, or None."""
        plan: list[int] = []
        in_string, depth, escaped = state
        while len(plan) < limit:
            if m.is_accepting():
                return plan + [self.stop_id]
            forced = m.compute_ff_tokens()
            token = forced[0] if forced else self._step(m, in_string, depth, escaped)
            if token is None or not m.consume_token(token):
                return None
            plan.append(token)
            in_string, depth, escaped, _ = scan(self.shapes.bytes[token], in_string, depth, escaped)
        return None

    def _step(self, m, in_string: bool, depth: int, escaped: bool) -> int | None:
        """The greedy choice, looking one token ahead: the best-ranked token after which the value can end
        or something close (so `-0.` is not followed by zeros forever where a range wants another digit)."""
        allowed = self.allowed_ids(m)
        if allowed.size == 0:
            return None
        candidates = self.shapes.ranked(allowed, in_string, depth)
        for token in candidates:
            after = m.deep_copy()
            if not after.consume_token(token):
                continue
            if after.is_accepting():
                return token
            s, d, _, _ = scan(self.shapes.bytes[token], in_string, depth, escaped)
            following = self.allowed_ids(after)
            if following.size and self.shapes.progresses(following, s, d):
                return token
        return candidates[0]
