"""A KV cache with its own length per row, for continuous batching.

The engine's `KVCache` holds one batch from its prefill to its end: every row is left-padded to the
longest prompt and all rows advance together. A server's batch changes every step: rows finish and
leave, new requests join. `SlotCache` keeps the layout the model's forward already understands
(left padding, `pad_lens`) but lets each row start where it likes:

    columns   0 ........ pad[b] ............. pos      capacity
    row b     [  unused  | prompt + generated ]|  next token is written at column `pos`

Every row's tokens end at the shared column `pos` (the next write) and start at its own column
`pad[b]`, so a row's length is `pos - pad[b]` and its RoPE positions run 0.. from `pad[b]`, exactly
as alone. A new request is prefilled on its own (any cache; `insert` copies its K/V into columns
`[pos - P, pos)` of a free row): `pos` never drops below the model's context, so every prompt fits
before it. A finished row leaves at once (`remove`: the last row moves into its slot, so the active
rows are always `0..n-1` and a step runs on exactly `n` rows). Attention reads columns
`[lo, pos]` only, `lo` being the smallest `pad` of the active rows, so columns every row has left
cost nothing; when `pos` reaches the capacity (context + headroom) the windows shift left
(`_compact`: one copy per `headroom` steps).

To the model this is an ordinary cache for one-token steps (`prepare`, `pad_lens`, `attn_mask`,
`layers[i].update`, `advance`), so `Transformer.forward` is used unchanged. `prepare` reports
positions relative to `lo` (start = pos - lo, pad_lens = pad - lo): the RoPE position of a row's new
token is `pos - pad[b]` and the model's context check sees the longest row, not the column.
"""

from __future__ import annotations

import torch

from groundup.model.attention import AttnMask
from groundup.model.config import ModelConfig


class SlotLayer:
    """One layer's two buffers (batch first; GQA: (S, Hkv, C, D), MLA: (S, C, rank) and (S, C, rope))."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, seq_dim: int, owner: "SlotCache"):
        self.a, self.b, self.seq_dim, self.owner = a, b, seq_dim, owner

    def update(self, a_new: torch.Tensor, b_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.owner
        n, d = c.n, self.seq_dim
        self.a[:n].narrow(d, c.pos, 1).copy_(a_new)
        self.b[:n].narrow(d, c.pos, 1).copy_(b_new)
        width = c.pos + 1 - c.lo
        return self.a[:n].narrow(d, c.lo, width), self.b[:n].narrow(d, c.lo, width)


class SlotCache:
    def __init__(self, cfg: ModelConfig, slots: int, device: torch.device | str, dtype: torch.dtype,
                 headroom: int | None = None):
        """`slots`: the most rows decoded together; `headroom`: columns past the context (default
        max(64, context // 2)) that pass between two compactions."""
        self.context = cfg.max_seq_len
        self.slots = slots
        self.capacity = self.context + (headroom or max(64, self.context // 2))
        self.device = torch.device(device)
        S, C = slots, self.capacity
        self.layers: list[SlotLayer] = []
        for _ in range(cfg.n_layers):
            if cfg.attention == "mla":
                a = torch.zeros(S, C, cfg.kv_lora_rank, device=device, dtype=dtype)
                b = torch.zeros(S, C, cfg.qk_rope_head_dim, device=device, dtype=dtype)
                self.layers.append(SlotLayer(a, b, 1, self))
            else:
                shape = (S, cfg.kv_heads, C, cfg.attn_head_dim)
                a = torch.zeros(shape, device=device, dtype=dtype)
                b = torch.zeros(shape, device=device, dtype=dtype)
                self.layers.append(SlotLayer(a, b, 2, self))
        self.pad = torch.zeros(S, dtype=torch.long, device=device)  # first column of each row
        self.pad_host = [0] * S  # the same, as Python ints
        self.n = 0  # active rows: 0..n-1
        self.pos = self.context  # the column the next token is written to
        self.lo = self.pos  # the first column attention reads
        self.compactions = 0

    # ------------------------------------------------------------------ rows

    @property
    def free(self) -> int:
        return self.slots - self.n

    def length(self, row: int) -> int:
        return self.pos - self.pad_host[row]

    def insert(self, src, src_row: int, start: int, length: int) -> int:
        """Copy `length` positions of row `src_row` of cache `src` (a KVCache, or anything with
        `layers[i].a/.b` laid out like ours), starting at its column `start`, into a new row; return
        the row's index. Its next token goes to column `pos`, RoPE position `length`."""
        if self.n >= self.slots:
            raise RuntimeError("no free slot")
        if length > self.pos:
            raise ValueError(f"a prompt of {length} tokens does not fit before column {self.pos}")
        row = self.n
        first = self.pos - length
        for mine, theirs in zip(self.layers, src.layers):
            d = mine.seq_dim - 1  # the sequence dimension once the batch index is taken
            mine.a[row].narrow(d, first, length).copy_(theirs.a[src_row].narrow(d, start, length))
            mine.b[row].narrow(d, first, length).copy_(theirs.b[src_row].narrow(d, start, length))
        self.pad[row] = first
        self.pad_host[row] = first
        self.n += 1
        self.lo = min(self.lo, first)
        return row

    def remove(self, row: int) -> int | None:
        """Free `row`; the last row moves into it. Returns the index the moved row had (None: none moved)."""
        last = self.n - 1
        moved = None
        if row != last:
            first = self.pad_host[last]
            for layer in self.layers:
                d = layer.seq_dim - 1
                width = self.pos - first
                layer.a[row].narrow(d, first, width).copy_(layer.a[last].narrow(d, first, width))
                layer.b[row].narrow(d, first, width).copy_(layer.b[last].narrow(d, first, width))
            self.pad[row] = first
            self.pad_host[row] = first
            moved = last
        self.n -= 1
        if self.n == 0:
            self.pos = self.lo = self.context
        else:
            self.lo = min(self.pad_host[: self.n])
        return moved

    def clear(self) -> None:
        self.n = 0
        self.pos = self.lo = self.context

    # ------------------------------------------------------------------ what the model calls

    def prepare(self, n_new: int) -> int:
        if n_new != 1:
            raise ValueError("SlotCache decodes one token per row per step; prefill into a KVCache and insert it")
        if self.pos >= self.capacity:
            self._compact()
        self.lo = min(self.pad_host[: self.n])
        return self.pos - self.lo

    @property
    def pad_lens(self) -> torch.Tensor:
        return self.pad[: self.n] - self.lo

    def attn_mask(self, q_len: int) -> AttnMask:
        cols = torch.arange(self.lo, self.pos + 1, device=self.device)
        return AttnMask(causal=False, mask=(cols[None] >= self.pad[: self.n, None])[:, None, None])

    def advance(self, n_new: int) -> None:
        self.pos += n_new

    # ------------------------------------------------------------------ housekeeping

    def _compact(self) -> None:
        """Shift every row's window left, keeping `pos >= context` (so any prompt still fits before it)."""
        shift = min(self.lo, self.pos - self.context)
        if shift <= 0:
            raise RuntimeError("KV cache full: a row is longer than the model's context")
        width = self.pos - self.lo
        for layer in self.layers:
            d = layer.seq_dim
            for buf in (layer.a, layer.b):
                window = buf[: self.n].narrow(d, self.lo, width).clone()
                buf[: self.n].narrow(d, self.lo - shift, width).copy_(window)
        self.pad[: self.n] -= shift
        self.pad_host[: self.n] = [p - shift for p in self.pad_host[: self.n]]
        self.pos -= shift
        self.lo -= shift
        self.compactions += 1

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.a, layer.b))
