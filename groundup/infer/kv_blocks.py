"""The paged KV cache: fixed-size blocks, a block table per sequence, and the prefix cache over them.

    pool = BlockPool(num_blocks=512, block_size=16)
    pages = KVPages(model.cfg, pool, device, dtype)       # per layer: K and V (or MLA's latent) per slot
    blocks = pool.allocate(3)                            # None when not enough blocks are free
    hit = pool.cached_prefix(block_hashes(tokens, 16))   # the longest cached run of full blocks (shared)

Memory is `num_blocks x block_size` token slots per layer, shared by every sequence: a sequence holds
the blocks its tokens fill (its block table), so memory grows with the tokens in use, not with the
batch slots times the context. Slot `block * block_size + offset` holds the K/V of the token at
position `offset` of that block. Block 0 is never handed out: it is the null block that padding
positions point at (they are masked, so what it holds is never read into an output).

Prefix caching, as vLLM does it: a full block is keyed by a hash of its tokens, its parent block's
hash and the adapter that computed it, so a key names the whole prefix up to that block. A sequence
that finishes returns its blocks to the free list with their keys kept; a new request whose prompt
starts with the same blocks takes them back (reference counts) instead of prefilling them again. Free
blocks are reused least recently freed first, and a reused block loses its key. `hits` and `queries`
count full prompt blocks found and looked up.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from groundup.model.attention import AttnMask, build_mask
from groundup.model.config import ModelConfig

NULL_BLOCK = 0


def block_hashes(tokens: list[int], block_size: int, extra: int = 0) -> list[int]:
    """The key of each full block of `tokens`: a hash of the parent key, the block's tokens and `extra`
    (the adapter), so equal keys mean equal prefixes (up to a 64-bit collision)."""
    out, parent = [], hash(("groundup-kv", extra))
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        out.append(parent)
    return out


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 2:
            raise ValueError(f"num_blocks = {num_blocks}: at least 2 (block 0 is the null block)")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.refs = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.key_of: dict[int, int] = {}  # block -> its prefix key, while it holds a full cached block
        self.block_of: dict[int, int] = {}  # prefix key -> block
        self.hits = self.queries = 0

    @property
    def free_count(self) -> int:
        return len(self.free)

    @property
    def used(self) -> int:
        """Blocks held by sequences (the null block not counted)."""
        return self.num_blocks - 1 - len(self.free)

    def allocate(self, n: int) -> list[int] | None:
        """`n` blocks for one sequence (reference count 1), or None when fewer are free."""
        if n > len(self.free):
            return None
        out = []
        for _ in range(n):
            block, _ = self.free.popitem(last=False)  # least recently freed first
            key = self.key_of.pop(block, None)
            if key is not None:
                del self.block_of[key]
            self.refs[block] = 1
            out.append(block)
        return out

    def release(self, blocks: list[int]) -> None:
        """One reference less on each block; a block nobody holds goes to the free list, its key kept."""
        for block in reversed(blocks):  # a sequence's last blocks are evicted first
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free[block] = None

    def cached_prefix(self, keys: list[int]) -> list[int]:
        """The blocks of the longest run of `keys` found in the cache, each now held once more."""
        found = []
        for key in keys:
            block = self.block_of.get(key)
            if block is None:
                break
            found.append(block)
        self.queries += len(keys)
        self.hits += len(found)
        for block in found:
            if self.refs[block] == 0:
                del self.free[block]
            self.refs[block] += 1
        return found

    def register(self, block: int, key: int) -> None:
        """Offer a full block under its prefix key (first come: an equal block already cached stays)."""
        if key not in self.block_of and block not in self.key_of:
            self.block_of[key] = block
            self.key_of[block] = key

    def share(self, blocks: list[int]) -> list[int]:
        """The same blocks held once more (a forked sequence shares its parent's full blocks)."""
        for block in blocks:
            self.refs[block] += 1
        return list(blocks)


class KVPages:
    """Every layer's K/V storage: one row per slot (`num_blocks * block_size` slots)."""

    def __init__(self, cfg: ModelConfig, pool: BlockPool, device: torch.device | str, dtype: torch.dtype):
        self.pool = pool
        slots = pool.num_blocks * pool.block_size
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        for _ in range(cfg.n_layers):
            if cfg.attention == "mla":  # the compressed latent and the shared RoPE key
                shapes = ((slots, cfg.kv_lora_rank), (slots, cfg.qk_rope_head_dim))
            else:
                shapes = ((slots, cfg.kv_heads, cfg.attn_head_dim),) * 2
            self.layers.append(tuple(torch.zeros(s, device=device, dtype=dtype) for s in shapes))
        self.seq_dim = 1 if cfg.attention == "mla" else 2  # where the model's K/V tensors keep positions

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.layers for t in pair)

    def copy_block(self, src: int, dst: int, n: int) -> None:
        """The first `n` slots of block `src` into block `dst` (a forked sequence's partial last block)."""
        size = self.pool.block_size
        for pair in self.layers:
            for t in pair:
                t[dst * size : dst * size + n] = t[src * size : src * size + n]


def slot_index(blocks: list[int], positions: range, block_size: int) -> list[int]:
    """Slots of a sequence's `positions` (each inside its block table)."""
    return [blocks[p // block_size] * block_size + p % block_size for p in positions]


class PagedLayer:
    """The model's per-layer cache protocol over the pages: `update` writes the new positions' K/V into
    their slots and returns the batch's dense, left-padded K/V (the gathered prefix, then the new ones)."""

    def __init__(self, pair: tuple[torch.Tensor, torch.Tensor], view: "PagedView"):
        self.pair, self.view = pair, view

    def update(self, a_new: torch.Tensor, b_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = self.view
        out = []
        for store, new in zip(self.pair, (a_new, b_new)):
            rows = new.movedim(v.seq_dim, 1)  # (B, T, ...) whatever the layer's layout
            flat = rows.reshape(-1, *rows.shape[2:])
            if v.write_slots.numel():
                store.index_copy_(0, v.write_slots, flat.index_select(0, v.write_from).to(store.dtype))
            if v.gather.shape[1]:
                old = store.index_select(0, v.gather.reshape(-1)).view(v.gather.shape[0], v.gather.shape[1],
                                                                       *store.shape[1:])
                rows = torch.cat([old.to(rows.dtype), rows], dim=1)
            out.append(rows.movedim(1, v.seq_dim))
        return out[0], out[1]


class PagedView:
    """A batch of sequences seen through the pages as the model's cache (`Transformer.forward(cache=...)`).

    The batch is laid out left-padded to `width` positions, each row right-aligned: row b's `length_b`
    tokens end at column `width`. The forward's `T` input tokens are each row's last `T` positions;
    the earlier `width - T` come from the pages (`gather`, padding columns point at the null block).
    Only positions at or past each row's `cached` length are written (`write_slots`): an earlier
    position inside the window is recomputed from its token but never written over (its block may be
    shared with other sequences)."""

    def __init__(self, pages: KVPages, gather: torch.Tensor, write_slots: torch.Tensor, write_from: torch.Tensor,
                 pad_lens: torch.Tensor | None, width: int, n_new: int):
        self.gather, self.write_slots, self.write_from = gather, write_slots, write_from
        self.pad_lens, self.width, self.n_new, self.seq_dim = pad_lens, width, n_new, pages.seq_dim
        self.layers = [PagedLayer(pair, self) for pair in pages.layers]

    def prepare(self, n_new: int) -> int:
        if n_new != self.n_new:
            raise ValueError(f"this view was laid out for {self.n_new} new positions, not {n_new}")
        return self.width - n_new

    def attn_mask(self, q_len: int) -> AttnMask:
        return build_mask(q_len, self.width - q_len, self.pad_lens, self.gather.device)

    def advance(self, n_new: int) -> None:
        pass


def layout(pages: KVPages, rows: list[tuple[list[int], int, int]], n_new: int, device) -> PagedView:
    """The view of rows (block table, tokens in the sequence after this forward, tokens already cached)
    for a forward over each row's last `n_new` positions."""
    size = pages.pool.block_size
    width = max(length for _, length, _ in rows)
    old = width - n_new
    gather = torch.zeros(len(rows), old, dtype=torch.long)
    write_slots, write_from, pads = [], [], []
    for b, (blocks, length, cached) in enumerate(rows):
        pad = width - length
        pads.append(pad)
        first = length - n_new  # the sequence position of the window's first column
        if first > 0:
            gather[b, max(0, pad):] = torch.tensor(slot_index(blocks, range(0, first), size), dtype=torch.long)
        start = max(cached, first, 0)
        write_slots += slot_index(blocks, range(start, length), size)
        write_from += [b * n_new + (p - first) for p in range(start, length)]
    pad_lens = torch.tensor(pads, device=device) if any(pads) else None
    return PagedView(pages, gather.to(device), torch.tensor(write_slots, dtype=torch.long, device=device),
                     torch.tensor(write_from, dtype=torch.long, device=device), pad_lens, width, n_new)
