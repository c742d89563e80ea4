"""A decode step with static shapes, for `torch.compile` (and CUDA graphs on GPU).

The eager engine attends over the filled prefix of the cache, whose length grows every step; a
compiled step would then see a new shape, and a new position as a Python int, at every token and
recompile. Here the cache spans the whole context, the position is a one-element tensor, K/V are
written with `index_copy_` and positions not yet written are masked: every step runs the same
graph. The prefill stays eager (its length differs per call and it runs once).

One cache per batch size is kept and reused, so its buffers keep their addresses across calls,
which CUDA graphs require.
"""

from __future__ import annotations

import math

import torch

from groundup.model.attention import AttnMask
from groundup.model.kv_cache import KVCache, StaticLayerCache
from groundup.model.transformer import Transformer


class StaticDecoder:
    def __init__(self, model: Transformer, compile: bool = True):
        """`compile=False` runs the same static step eagerly (tests check it equals the eager engine)."""
        self.model = model
        self.cfg = model.cfg
        self.device = model.embed.weight.device
        self.dtype = model.embed.weight.dtype
        self._caches: dict[int, KVCache] = {}
        # CUDA graphs ("reduce-overhead") remove the per-kernel launch cost that dominates decoding
        # on GPU; on CPU there is nothing to capture and inductor's fused C++ kernels are the gain.
        mode = "reduce-overhead" if self.device.type == "cuda" else None
        self._compiled = torch.compile(self._decode, dynamic=False, mode=mode) if compile else self._decode

    def new_cache(self, batch_size: int, pad_lens: torch.Tensor | None) -> KVCache:
        cache = self._caches.get(batch_size)
        if cache is None:
            cache = KVCache(self.cfg, batch_size, self.cfg.max_seq_len, self.device, self.dtype)
            if self.device.type == "cuda":
                for layer in cache.layers:
                    torch._dynamo.mark_static_address(layer.a)
                    torch._dynamo.mark_static_address(layer.b)
            self._caches[batch_size] = cache
        cache.reset(pad_lens)
        return cache

    def step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (B, V) after one token per row (B, 1), written at the cache's position."""
        cache.prepare(1)  # checks there is room
        pos = torch.full((1,), cache.pos, dtype=torch.long, device=self.device)
        buffers = [(layer.a, layer.b, layer.seq_dim) for layer in cache.layers]
        logits = self._compiled(tokens, pos, buffers, cache.pad_lens, cache.key_valid)
        cache.advance(1)
        return logits

    def _decode(self, tokens, pos, buffers, pad_lens, key_valid) -> torch.Tensor:
        model, cfg = self.model, self.cfg
        x = model.embed(tokens)
        if cfg.embed_scale:
            x = x * math.sqrt(cfg.d_model)
        rope_pos = pos if pad_lens is None else (pos - pad_lens).clamp_min(0)  # (1,) or (B,)
        cos = model.rope_cos[rope_pos][:, None, None].to(x.dtype)  # (1 or B, 1, 1, D)
        sin = model.rope_sin[rope_pos][:, None, None].to(x.dtype)
        mask = (torch.arange(cache_len(buffers), device=pos.device) <= pos)[None, None, None]
        if key_valid is not None:
            mask = mask & key_valid
        attn_mask = AttnMask(causal=False, mask=mask)
        for block, (a, b, seq_dim) in zip(model.blocks, buffers):
            x, _ = block(x, cos, sin, attn_mask, StaticLayerCache(a, b, seq_dim, pos))
        if model.norm is not None:
            x = model.norm(x)
        return model._logits(x)[:, -1]


def cache_len(buffers) -> int:
    a, _, seq_dim = buffers[0]
    return a.shape[seq_dim]
