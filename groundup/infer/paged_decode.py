"""The decode step: one token per running sequence through the model, its K/V written to the pages.

    step = DecodeStep(model, pages, compile=False)
    logits = step(tokens, positions, block_tables, write_slots)      # (B, V) float32

The pages (kv_blocks.py) are the record of every sequence's K/V: each new token's K/V is written to its
slot there. To read them, attention needs each row's keys side by side, so the step keeps the batch's
keys gathered from the pages in the model's own layout (`held`: per layer, (B, Hkv, W, D), or MLA's
(B, W, rank)), with position p of a row at column p. Between two steps only each row's new position
changes, so the new K/V are also written into `held`, and the pages are gathered again only when a
block table changes (a row took a new block, or the batch changed): once per `block_size` steps in a
steady batch. Columns past a row's position are masked; when every row is at one position (a batch
decoding in step, eagerly) attention reads the first `position + 1` columns unmasked.

Everything that changes between steps inside the model is a tensor (tokens, positions, the slots to
write, the held keys), so the same step runs eagerly or `torch.compile`d with one graph for every batch
size and length (dynamic dimensions). Compiled on a CPU, the weights are frozen into the graph and its
matmuls use inductor's C++ micro-kernels, which for the few-row matmuls of decoding run up to 2.7x
faster than the BLAS behind eager `F.linear` here; compiling takes under a minute, once per process.
"""

from __future__ import annotations

import math

import torch

from groundup.model.attention import AttnMask
from groundup.model.transformer import Transformer

# Inductor reads these when it compiles, which happens inside a call. `options=` in torch.compile
# does not reach freezing, and setting them globally would freeze the weights of every other
# compiled model in the process (a training step's, say), so each call patches them.
CPU_INDUCTOR_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP"}


class _StepLayer:
    """The model's per-layer cache protocol for one decode step: the new K/V go to their page slots and
    into the held keys, which attention reads."""

    def __init__(self, pair: tuple[torch.Tensor, torch.Tensor], held: list[torch.Tensor], positions: torch.Tensor,
                 write_slots: torch.Tensor, seq_dim: int, width: int | None):
        self.pair, self.held, self.positions, self.write_slots = pair, held, positions, write_slots
        self.seq_dim, self.width = seq_dim, width

    def update(self, a_new: torch.Tensor, b_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for store, keys, new in zip(self.pair, self.held, (a_new, b_new)):
            one = new.movedim(self.seq_dim, 1)[:, 0]  # (B, ...)
            store.index_copy_(0, self.write_slots, one.to(store.dtype))
            if self.width is not None:  # every row at one position: one narrow copy, no mask
                keys.narrow(self.seq_dim, self.width - 1, 1).copy_(new)
                out.append(keys.narrow(self.seq_dim, 0, self.width))
                continue
            rows = torch.arange(keys.shape[0], device=keys.device)
            keys[(rows,) + (slice(None),) * (self.seq_dim - 1) + (self.positions,)] = one.to(keys.dtype)
            out.append(keys)
        return out[0], out[1]


class PagedStep(torch.nn.Module):
    """One token per row through the model (a module, so freezing sees the weights as its attributes)."""

    def __init__(self, model: Transformer, seq_dim: int):
        super().__init__()
        self.model, self.seq_dim = model, seq_dim

    def forward(self, tokens, positions, write_slots, pairs, held, width=None) -> torch.Tensor:
        """`width`: every row is at position width - 1 and attends to the first `width` columns, unmasked."""
        model, cfg = self.model, self.model.cfg
        x = model.embed(tokens)
        if cfg.embed_scale:
            x = x * math.sqrt(cfg.d_model)
        cos = model.rope_cos[positions][:, None, None].to(x.dtype)  # (B, 1, 1, D)
        sin = model.rope_sin[positions][:, None, None].to(x.dtype)
        if width is None:
            columns = torch.arange(held[0][0].shape[self.seq_dim], device=tokens.device)
            mask = AttnMask(causal=False, mask=(columns[None] <= positions[:, None])[:, None, None])  # (B, 1, 1, W)
        else:
            mask = AttnMask(causal=False)
        for block, pair, keys in zip(model.blocks, pairs, held):
            x, _ = block(x, cos, sin, mask, _StepLayer(pair, keys, positions, write_slots, self.seq_dim, width))
        if model.norm is not None:
            x = model.norm(x)
        return model.logits(x)[:, -1]


class DecodeStep:
    def __init__(self, model: Transformer, pages, compile: bool = False):
        self.model, self.pages, self.compiled = model, pages, compile
        step = PagedStep(model, pages.seq_dim)
        self._step = torch.compile(step) if compile else step
        self._options = dict(CPU_INDUCTOR_OPTIONS) if compile and model.device.type == "cpu" else {}
        if model.cfg.attention == "mla" and self._options:  # its absorbed-weight einsums have no C++ template
            self._options["max_autotune_gemm_backends"] = "CPP,ATEN"
        self._tables: torch.Tensor | None = None  # the block tables `_held` was gathered for
        self._held: list[list[torch.Tensor]] = []

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, tables: torch.Tensor,
                 write_slots: torch.Tensor, same_position: int | None = None) -> torch.Tensor:
        """Logits (B, V) of the next token after `tokens` (B, 1) at `positions` (B,); `tables` (B, n): each row's
        blocks (padded with the null block), `write_slots` (B,): where each new K/V goes. `same_position`: the
        position every row is at, when they all are at one (eager decoding then needs no mask)."""
        # Equal tables mean the same blocks in the same rows: nothing but this step writes them (a prefill or
        # a fork writes only blocks of its own, and a freed block leaves its row's table first).
        if self._tables is None or self._tables.shape != tables.shape or not torch.equal(self._tables, tables):
            self._tables, self._held = tables, [self._gather(pair, tables) for pair in self.pages.layers]
        if not self.compiled:
            width = None if same_position is None else same_position + 1
            return self._step(tokens, positions, write_slots, self.pages.layers, self._held, width)
        # One graph for every batch size, length and pool size.
        marks = [(t, (0,)) for t in (tokens, positions, write_slots)]
        marks += [(t, (0,)) for pair in self.pages.layers for t in pair]
        marks += [(t, (0, self.pages.seq_dim)) for pair in self._held for t in pair]
        for t, dims in marks:
            for d in dims:
                torch._dynamo.maybe_mark_dynamic(t, d)
        with torch._inductor.config.patch(self._options):
            return self._step(tokens, positions, write_slots, self.pages.layers, self._held)

    def invalidate(self) -> None:
        """Gather again at the next call (something other than this step wrote the batch's pages)."""
        self._tables = None

    def _gather(self, pair: tuple[torch.Tensor, torch.Tensor], tables: torch.Tensor) -> list[torch.Tensor]:
        """A layer's keys (and values) of every row, whole blocks from the pages, in the model's layout."""
        B, n_blocks = tables.shape
        size, seq_dim = self.pages.pool.block_size, self.pages.seq_dim
        out = []
        for store in pair:
            blocks = store.view(-1, size, *store.shape[1:]).index_select(0, tables.reshape(-1))
            keys = blocks.view(B, n_blocks * size, *store.shape[1:]).to(self.model.dtype)
            out.append(keys.movedim(1, seq_dim).contiguous())
        return out
