"""Fine-tuning examples as training rows: tokenized with the loss mask, packed or padded, and a loader
with exact resume and optional replay of pretraining data.

    examples = [tokenize(ex, tok, "assistant") for ex in iter_examples(files)]
    rows, report = pack(examples, seq_len)        # best-fit, no example cut; report: padding, dropped
    loader = SFTLoader(rows, batch_size, seed, replay=TokenLoader(...) or None, replay_rows=2)

A tokenized example is its ids and a mask saying which tokens are learned (1) — the chat template's
assistant tokens and end of turn (its text and its tool calls; never tool results or the tool
definitions, which the record's `tools` put in the system turn), the completion, or everything. As
a training sequence it becomes inputs ids[:-1] and targets ids[1:] with unlearned targets ignored.

Packing (best-fit decreasing): examples, longest first, go into the row whose free space fits them
most tightly, so no example is ever cut; an example longer than a row is dropped and counted.
Inside a row each example is its own segment: attention never crosses examples and positions
restart at each (the model's `segments=`). Without packing each row holds one example and a batch
is padded to its longest row. Either way, padding and dropped tokens are reported.

The loader's state is (epoch, row position, replay loader state): on CPU a resumed run sees exactly
the batches an uninterrupted one would.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from groundup.errors import CheckpointError, DataError
from groundup.model.loss import IGNORE_INDEX
from groundup.posttrain.records import Example


@dataclass
class Tokenized:
    ids: list[int]
    mask: list[int]  # 1 where the token is learned (as a target)
    index: int  # the example's number (for logs)
    meta: dict


class SFTBatch(NamedTuple):
    inputs: torch.Tensor  # (B, T)
    targets: torch.Tensor  # (B, T), IGNORE_INDEX where nothing is learned
    segments: torch.Tensor  # (B, T) example id per position; padding has its own segment
    docs: list[list[int]]  # example numbers per row (replay rows: [])
    domains: list[str]  # "sft" or "replay"


def tokenize(ex: Example, tok, loss_on: str, index: int = 0) -> Tokenized:
    """ids and learned-token mask of one example (see the module docstring)."""
    if ex.text is not None:
        ids = list(tok.prefix_ids) + tok.encode(ex.text) + [tok.eot_id]
        mask = [0] * len(tok.prefix_ids) + [1] * (len(ids) - len(tok.prefix_ids))
    elif ex.prompt_text is not None:
        prompt = list(tok.prefix_ids) + tok.encode(ex.prompt_text)
        completion = tok.encode(ex.completion_text) + [tok.eot_id]
        ids = prompt + completion
        mask = ([0] * len(prompt) if loss_on != "all" else [0] + [1] * (len(prompt) - 1)) + [1] * len(completion)
    else:
        ids, mask = tok.render_chat(ex.messages, tools=ex.tools)
        if loss_on == "completion":
            prompt_ids, _ = tok.render_chat(ex.messages[: ex.completion_at], add_generation_prompt=True,
                                            tools=ex.tools) if ex.completion_at > 0 else ([], [])
            mask = [m if i >= len(prompt_ids) else 0 for i, m in enumerate(mask)]
        elif loss_on == "all":
            mask = [0] + [1] * (len(ids) - 1)
    return Tokenized(list(ids), list(mask), index, ex.meta)


def _sequence(ex: Tokenized) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(ex.ids, dtype=np.int64)
    targets = np.where(np.asarray(ex.mask[1:], dtype=bool), ids[1:], IGNORE_INDEX)
    return ids[:-1], targets


@dataclass
class Row:
    inputs: np.ndarray
    targets: np.ndarray
    segments: np.ndarray
    examples: list[int]


def pack(examples: list[Tokenized], seq_len: int, pad_id: int, packing: bool = True) -> tuple[list[Row], dict]:
    """Training rows (each exactly seq_len with packing; each one example without) and a report."""
    report = {"examples": len(examples), "dropped_examples": 0, "dropped_tokens": 0, "no_target_examples": 0,
              "tokens": 0, "learned_tokens": 0, "padding_tokens": 0, "rows": 0}
    kept = []
    for ex in examples:
        n = len(ex.ids) - 1
        if n > seq_len:
            report["dropped_examples"] += 1
            report["dropped_tokens"] += n
            continue
        if not any(ex.mask[1:]):
            report["no_target_examples"] += 1
            continue
        kept.append(ex)
    if not packing:
        rows = []
        for ex in kept:
            x, t = _sequence(ex)
            rows.append(Row(x, t, np.zeros(len(x), dtype=np.int64), [ex.index]))
    else:
        bins: list[list[Tokenized]] = []
        free: list[tuple[int, int]] = []  # (free space, bin) sorted: best fit is the first with room
        for ex in sorted(kept, key=lambda e: (-len(e.ids), e.index)):
            need = len(ex.ids) - 1
            at = bisect.bisect_left(free, (need, -1))
            if at < len(free):
                space, b = free.pop(at)
            else:
                space, b = seq_len, len(bins)
                bins.append([])
            bins[b].append(ex)
            if space - need > 0:
                bisect.insort(free, (space - need, b))
        rows = []
        for members in bins:
            parts = [_sequence(ex) for ex in members]
            x = np.concatenate([p[0] for p in parts])
            t = np.concatenate([p[1] for p in parts])
            seg = np.concatenate([np.full(len(p[0]), k, dtype=np.int64) for k, p in enumerate(parts)])
            pad = seq_len - len(x)
            rows.append(Row(np.concatenate([x, np.full(pad, pad_id)]), np.concatenate([t, np.full(pad, IGNORE_INDEX)]),
                            np.concatenate([seg, np.full(pad, len(parts))]), [ex.index for ex in members]))
            report["padding_tokens"] += pad
    report["tokens"] = sum(len(ex.ids) - 1 for ex in kept)
    for r in rows:
        report["learned_tokens"] += int((r.targets != IGNORE_INDEX).sum())
    report["rows"] = len(rows)
    return rows, report


def collate(rows: list[Row], pad_id: int) -> SFTBatch:
    """A batch of rows, padded on the right to the longest (packed rows are all seq_len already)."""
    T = max(len(r.inputs) for r in rows)
    x = np.full((len(rows), T), pad_id, dtype=np.int64)
    t = np.full((len(rows), T), IGNORE_INDEX, dtype=np.int64)
    seg = np.zeros((len(rows), T), dtype=np.int64)
    for i, r in enumerate(rows):
        n = len(r.inputs)
        x[i, :n], t[i, :n], seg[i, :n] = r.inputs, r.targets, r.segments
        seg[i, n:] = r.segments.max() + 1 if n else 0
    return SFTBatch(torch.from_numpy(x), torch.from_numpy(t), torch.from_numpy(seg), [r.examples for r in rows],
                    ["sft"] * len(rows))


class SFTLoader:
    """Endless batches of fine-tuning rows, shuffled per epoch (seeded), with optional replay rows."""

    def __init__(self, rows: list[Row], batch_size: int, pad_id: int, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1, replay=None, replay_rows: int = 0):
        if not rows:
            raise DataError("no fine-tuning example fits: every one was dropped (longer than train.seq_len) or "
                            "has no learned token")
        self.rows, self.pad_id, self.seed = rows, pad_id, seed
        self.rank, self.world_size = rank, world_size
        self.replay, self.replay_rows = replay, replay_rows if replay is not None else 0
        self.batch_size = batch_size - self.replay_rows  # rows of fine-tuning data per batch
        self.epoch, self.position = 0, 0
        self._order_epoch, self._order = -1, np.arange(0)

    def _order_of(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
            self._order_epoch, self._order = epoch, perm[self.rank :: self.world_size]
            if len(self._order) == 0:
                self._order = perm[:1]
        return self._order

    @property
    def epochs_done(self) -> float:
        return self.epoch + self.position / max(1, len(self._order_of(self.epoch)))

    def __iter__(self):
        return self

    def __next__(self) -> SFTBatch:
        picked = []
        while len(picked) < self.batch_size:
            order = self._order_of(self.epoch)
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
                continue
            picked.append(self.rows[order[self.position]])
            self.position += 1
        batch = collate(picked, self.pad_id)
        if self.replay_rows:
            r = next(self.replay)  # seq_len-long windows; an unpacked batch may be shorter: cut them to it
            T = batch.inputs.shape[1]
            ri, rt = r.inputs[:, :T], r.targets[:, :T]
            batch = SFTBatch(torch.cat([batch.inputs, ri]), torch.cat([batch.targets, rt]),
                             torch.cat([batch.segments, torch.zeros_like(ri)]), batch.docs + [[] for _ in range(len(ri))],
                             batch.domains + ["replay"] * len(ri))
        return batch

    def document_names(self, examples: list[int]) -> list[str]:
        return [f"example {i}" for i in examples]

    def state_dict(self) -> dict:
        state = {"version": 1, "epoch": self.epoch, "position": self.position, "rows": len(self.rows),
                 "seed": self.seed, "batch_size": self.batch_size, "world_size": self.world_size, "rank": self.rank}
        if self.replay_rows:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        mine = {"rows": len(self.rows), "seed": self.seed, "batch_size": self.batch_size}
        for key, value in mine.items():
            if state.get(key) != value:
                raise CheckpointError(f"cannot resume the fine-tuning data: {key} is {value}, the checkpoint's "
                                      f"{state.get(key)} (the data files or the batch size changed)")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        if self.replay_rows:
            self.replay.load_state_dict(state["replay"])
