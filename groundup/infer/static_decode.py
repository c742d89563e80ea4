"""A compiled decode step: `torch.compile` of one token per row, with the cache held outside Python ints.

The eager engine attends over the filled prefix of the cache, and Transformer.forward keeps the
position as a Python int; compiled as is, every new position would be a new graph. Here the
position is a one-element tensor, K/V are written with `index_copy_` into preallocated buffers,
and the keys attended to are those the mask spans:

- on GPU the span is the whole buffer (positions not yet written are masked), so every step has the
  same shapes and CUDA graphs ("reduce-overhead") replay it without the per-kernel launch cost
  that dominates decoding. Buffers are kept per (batch size, length) so their addresses persist.
- on CPU there is no launch cost to remove, but attending over the whole buffer is work wasted on
  empty positions, so the span is the filled prefix, marked dynamic: one graph serves every length.
  Weights are frozen into the graph and its matmuls use inductor's C++ micro-kernels, which for the
  few-row matmuls of decoding run up to 2.7x faster than the BLAS behind eager `F.linear` here.
  Compiling takes about a minute per batch size, once per process (buffer lengths are dynamic too).

The buffer length is the needed length rounded up to a power of two (at least 64, at most the
context). The prefill stays eager: its length differs per call and it runs once.
"""

from __future__ import annotations

import math

import torch

from groundup.model.attention import AttnMask
from groundup.model.kv_cache import KVCache, StaticLayerCache
from groundup.model.transformer import Transformer

# Inductor reads these when it compiles, which happens inside a call. `options=` in torch.compile
# does not reach freezing, and setting them globally would freeze the weights of every other
# compiled model in the process (a training step's, say), so each call patches them.
CPU_INDUCTOR_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP"}


class StaticDecoder:
    def __init__(self, model: Transformer, compile: bool = True, full_span: bool | None = None):
        """`compile=False` runs the same step eagerly (tests check it equals the eager engine);
        `full_span` (default: on CUDA) attends over the whole buffer rather than the filled prefix."""
        self.model = model
        self.cfg = model.cfg
        self.device = model.device
        self.dtype = model.dtype
        self.compiled = compile
        self.full_span = self.device.type == "cuda" if full_span is None else full_span
        self._caches: dict[tuple[int, int], KVCache] = {}
        step = DecodeStep(model)  # a module, so freezing sees the weights as its attributes
        if not compile:
            self._step = step
        elif self.full_span:
            self._step = torch.compile(step, dynamic=False, mode="reduce-overhead")
        else:
            self._step = torch.compile(step)
        self._inductor_options = {} if self.device.type != "cpu" else dict(CPU_INDUCTOR_OPTIONS)
        if self.cfg.attention == "mla":  # its absorbed-weight einsums have no C++ template: allow BLAS
            self._inductor_options["max_autotune_gemm_backends"] = "CPP,ATEN"
        self._all_keys = torch.ones(1, 1, 1, self.cfg.max_seq_len, dtype=torch.bool, device=self.device)

    def new_cache(self, batch_size: int, length: int, pad_lens: torch.Tensor | None) -> KVCache:
        """A reset cache for `batch_size` rows and at least `length` positions."""
        length = min(max(64, 1 << (length - 1).bit_length()), self.cfg.max_seq_len)
        cache = self._caches.get((batch_size, length))
        if cache is None:
            cache = KVCache(self.cfg, batch_size, length, self.device, self.dtype)
            for layer in cache.layers if self.compiled else ():
                for buf in (layer.a, layer.b):
                    if self.full_span:
                        torch._dynamo.mark_static_address(buf)
                    else:  # one CPU graph for every buffer length too
                        torch._dynamo.maybe_mark_dynamic(buf, layer.seq_dim)
            self._caches[(batch_size, length)] = cache
        cache.reset(pad_lens)
        return cache

    def step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (B, V) after one token per row (B, 1), written at the cache's position."""
        cache.prepare(1)  # checks there is room
        pos = torch.full((1,), cache.pos, dtype=torch.long, device=self.device)
        valid = cache.key_valid if cache.key_valid is not None else self._all_keys
        if self.full_span:
            mask = valid[..., : cache.max_len] & (torch.arange(cache.max_len, device=self.device) <= pos)
        else:
            mask = valid[..., : cache.pos + 1]
            if self.compiled:
                # "maybe": where the model breaks the graph (MoE routing reads expert counts on the
                # host), the frames after the break see the cache as fresh inputs and specialise to
                # a length once before dynamo makes them dynamic too; mark_dynamic would refuse that.
                torch._dynamo.maybe_mark_dynamic(mask, 3)
        buffers = [(layer.a, layer.b, layer.seq_dim) for layer in cache.layers]
        with torch._inductor.config.patch(self._inductor_options):
            logits = self._step(tokens, pos, buffers, cache.pad_lens, mask)
        cache.advance(1)
        return logits


class DecodeStep(torch.nn.Module):
    """One token per row through the model; attends to the first mask.shape[-1] cached positions."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, tokens, pos, buffers, pad_lens, mask) -> torch.Tensor:
        model, cfg = self.model, self.model.cfg
        x = model.embed(tokens)
        if cfg.embed_scale:
            x = x * math.sqrt(cfg.d_model)
        rope_pos = pos if pad_lens is None else (pos - pad_lens).clamp_min(0)  # (1,) or (B,)
        cos = model.rope_cos[rope_pos][:, None, None].to(x.dtype)  # (1 or B, 1, 1, D)
        sin = model.rope_sin[rope_pos][:, None, None].to(x.dtype)
        span, attn_mask = mask.shape[-1], AttnMask(causal=False, mask=mask)
        for block, (a, b, seq_dim) in zip(model.blocks, buffers):
            x, _ = block(x, cos, sin, attn_mask, StaticLayerCache(a, b, seq_dim, pos, span))
        if model.norm is not None:
            x = model.norm(x)
        return model.logits(x)[:, -1]
