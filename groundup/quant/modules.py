"""Quantized modules that stand in for the model's float ones, with the same forward contracts.

    QuantWeight      the integer tensors of one weight (or of stacked experts) and its matmul
    QuantLinear      for nn.Linear: forward(x) = x W^T + b; `.weight` gives the dequantized weight
                     (MLA's cached path reads kv_up.weight to absorb it into queries and outputs)
    QuantEmbedding   for nn.Embedding: rows dequantized on lookup; also the output layer when tied
    QuantMoE         for MoE: the same routing (its router stays float), experts over stacked
                     quantized weights; a subclass of MoE, so `moe_layers()` and `update_bias` work
    QuantizedTransformer   the Transformer whose output layer, when quantized, runs the kernel
    dequantize_model       a QuantizedTransformer back to a plain float Transformer, in place

Training through a quantized layer (QLoRA: frozen integer weights, adapters in full precision):
when the input needs a gradient, QuantLinear runs `QuantMatmul`, which keeps no float copy of the
weight for the backward pass (dequantize-then-matmul would keep one per layer, as much memory as
the float model) and dequantizes it again, transiently, to compute the input's gradient. The
integer weights never get a gradient.

State-dict names follow the float model's: `blocks.0.attn.qkv_proj.qweight` / `.scales` / `.zeros`
/ `.bias`, `blocks.1.mlp.experts_in.qweight`, `embed.qweight`. Buffers hold the formats of
formats.py; kernels.py picks the matmul.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from groundup.model.moe import MoE, moe_forward
from groundup.model.transformer import Transformer
from groundup.quant import kernels
from groundup.quant.formats import dequantize_int4, dequantize_int8, pack_int4, quantize_int4, quantize_int8


class QuantWeight(nn.Module):
    """A (…, N, K) weight in int8 or int4 (see formats.py); the leading dimension stacks experts."""

    def __init__(self, fmt: str, shape: tuple[int, ...], group_size: int | None = None,
                 device: torch.device | str | None = None, scale_dtype: torch.dtype = torch.float32):
        super().__init__()
        *lead, N, K = shape
        self.fmt, self.group_size = fmt, (group_size if fmt == "int4" else None)
        self.out_features, self.in_features = N, K
        self.shape = tuple(shape)
        if fmt == "int8":
            self.register_buffer("qweight", torch.empty(*lead, N, K, dtype=torch.int8, device=device))
            self.register_buffer("scales", torch.empty(*lead, N, dtype=scale_dtype, device=device))
            self.register_buffer("zeros", None)
        elif fmt == "int4":
            G = K // group_size
            self.register_buffer("qweight", torch.empty(*lead, N, K // 2, dtype=torch.uint8, device=device))
            self.register_buffer("scales", torch.empty(*lead, N, G, dtype=scale_dtype, device=device))
            self.register_buffer("zeros", torch.empty(*lead, N, G, dtype=torch.uint8, device=device))
        else:
            raise ValueError(f"unknown weight format {fmt!r}")
        self._kernel_cache: dict = {}  # converted weights for the packed kernels, per device and dtype

    # ------------------------------------------------------------------ construction

    def set_tensors(self, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None = None) -> "QuantWeight":
        self.qweight, self.scales = _own(qweight), _own(scales)
        if self.fmt == "int4":
            self.zeros = _own(zeros)
        self._kernel_cache = {}
        return self

    @staticmethod
    def from_float(w: torch.Tensor, fmt: str, group_size: int | None = None) -> "QuantWeight":
        """Round-to-nearest quantization of a float (…, N, K) weight."""
        module = QuantWeight(fmt, tuple(w.shape), group_size, device="meta")  # set_tensors replaces every buffer
        w = w.detach()
        return module.set_tensors(*(quantize_int8(w) if fmt == "int8" else quantize_int4(w, group_size)))

    @staticmethod
    def from_integers(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, fmt: str,
                      group_size: int | None = None) -> "QuantWeight":
        """From unpacked integers (int8 values, or 0..15 for int4) with their scales (and zeros)."""
        module = QuantWeight(fmt, tuple(q.shape), group_size, device="meta")
        if fmt == "int8":
            return module.set_tensors(q.to(torch.int8), scales.float())
        return module.set_tensors(pack_int4(q, group_size), scales.float(), zeros.to(torch.uint8))

    def _apply(self, fn, recurse=True):
        self._kernel_cache = {}  # moved or cast: converted weights are stale
        return super()._apply(fn, recurse)

    def _load_from_state_dict(self, *args, **kwargs):
        self._kernel_cache = {}  # new values (copied in, or assigned): converted weights are stale
        return super()._load_from_state_dict(*args, **kwargs)

    # ------------------------------------------------------------------ compute

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.scales.dtype

    def _select(self, index: int | None):
        """The tensors of the whole weight, or of expert `index`. An expert's are plain tensors
        aliasing the stacked ones (made once and kept), not views: torch.compile guards a view on
        its base, so views would compile each kernel again for experts."""
        if index is None:
            return self.qweight, self.scales, self.zeros
        tensors = (self.qweight, self.scales, self.zeros)
        if torch.compiler.is_compiling() or self.qweight.is_meta:
            return tuple(None if t is None else t[index] for t in tensors)
        stamp = (self.qweight.data_ptr(), self.scales.data_ptr(), self.scales.dtype)
        hit = self._kernel_cache.get(("expert", index))
        if hit is None or hit[0] != stamp:
            with torch.inference_mode(False), torch.no_grad():
                hit = (stamp, tuple(None if t is None else kernels.alias(t[index]) for t in tensors))
            self._kernel_cache[("expert", index)] = hit
        return hit[1]

    def matmul(self, x: torch.Tensor, index: int | None = None) -> torch.Tensor:
        """x (M, K) times the (index-th expert's) weight transposed: (M, N)."""
        q, s, z = self._select(index)
        if self.fmt == "int8":
            return kernels.int8_matmul(x, q, s)
        return kernels.int4_matmul(x, q, s, z, self._kernel_cache, key=(index,))

    def dequantize(self, dtype: torch.dtype | None = None, index: int | None = None) -> torch.Tensor:
        """The float weight (the index-th expert's), in `dtype` (default: the scales' dtype)."""
        dtype = dtype or self.compute_dtype
        if self.qweight.is_meta:  # a model being built: nothing to compute
            return torch.empty(self.shape if index is None else self.shape[1:], dtype=dtype, device="meta")
        q, s, z = self._select(index)
        return kernels.dequantize(self.fmt, q, s, z, dtype)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.fmt == "int4" else ""
        return f"{self.fmt}, shape={self.shape}{group}"


def _own(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and not a view of a larger tensor (kernels compile for plain tensors)."""
    t = t.detach().contiguous()
    return t.clone() if t._is_view() else t


class QuantLinear(QuantWeight):
    def __init__(self, fmt: str, in_features: int, out_features: int, bias: bool = False,
                 group_size: int | None = None, device=None, dtype: torch.dtype = torch.float32):
        super().__init__(fmt, (out_features, in_features), group_size, device)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str, group_size: int | None = None,
                    integers: tuple | None = None) -> "QuantLinear":
        """Quantize `linear` by RTN, or take `integers` = (q, scales, zeros) found by GPTQ."""
        w = linear.weight.detach()
        module = cls(fmt, linear.in_features, linear.out_features, False, group_size, device="meta")
        if integers is None:
            tensors = quantize_int8(w) if fmt == "int8" else quantize_int4(w, group_size)
        else:
            q, s, z = integers
            tensors = (q.to(torch.int8), s.float()) if fmt == "int8" else (pack_int4(q, group_size), s.float(),
                                                                           z.to(torch.uint8))
        module.set_tensors(*tensors)
        if linear.bias is not None:
            module.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        return module

    @property
    def weight(self) -> torch.Tensor:
        return self.dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if x.requires_grad and torch.is_grad_enabled():
            y = QuantMatmul.apply(rows, self)
        elif rows.shape[0] <= kernels.NATIVE_ROWS and not torch.compiler.is_compiling() and \
                (call := self._native_call(rows)) is not None:
            y = call[0](rows, *call[1:])  # decoding: straight to the native kernel (no per-call dispatch in Python)
        else:
            y = self.matmul(rows)
        y = y.reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _native_call(self, rows: torch.Tensor) -> tuple | None:
        """(op, tensors...) of the native kernel for these float32 CPU rows, cached until the tensors change."""
        if rows.dtype != torch.float32 or kernels.get_kernel_backend() not in ("auto", "native"):
            return None
        call = self._kernel_cache.get("native", False)
        if call is False:
            call = None
            if self.qweight.device.type == "cpu" and self.scales.dtype == torch.float32 and kernels._native_ready():
                if self.fmt == "int8":
                    call = (torch.ops.groundup_quant.int8_mm.default, self.qweight, self.scales)
                elif self.group_size % 32 == 0:
                    call = (torch.ops.groundup_quant.int4_mm.default, self.qweight, self.scales, self.zeros,
                            self.group_size)
            self._kernel_cache["native"] = call
        return call


class QuantMatmul(torch.autograd.Function):
    """y = x W^T over a QuantWeight, differentiable in x only; saves nothing but the module."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
        ctx.weight = weight
        return weight.matmul(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad @ ctx.weight.dequantize(grad.dtype), None


class QuantEmbedding(QuantWeight):
    @classmethod
    def from_embedding(cls, emb: nn.Embedding, fmt: str, group_size: int | None = None) -> "QuantEmbedding":
        module = cls(fmt, tuple(emb.weight.shape), group_size, device="meta")
        w = emb.weight.detach()
        return module.set_tensors(*(quantize_int8(w) if fmt == "int8" else quantize_int4(w, group_size)))

    @property
    def num_embeddings(self) -> int:
        return self.out_features

    @property
    def embedding_dim(self) -> int:
        return self.in_features

    @property
    def weight(self) -> torch.Tensor:
        """The whole table, dequantized (the tied output layer's loss path and sizing read it)."""
        return self.dequantize()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        dtype = self.compute_dtype
        if self.fmt == "int8":
            return dequantize_int8(self.qweight[ids], self.scales[ids], dtype)
        return dequantize_int4(self.qweight[ids], self.scales[ids], self.zeros[ids], self.group_size, dtype)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x @ table^T through the kernel: the tied output layer."""
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        y = QuantMatmul.apply(rows, self) if x.requires_grad and torch.is_grad_enabled() else self.matmul(rows)
        return y.reshape(*shape[:-1], self.out_features)


# ----------------------------------------------------------------------------- MoE


class QuantMoE(MoE):
    """MoE over quantized stacked experts: experts_in (E, 2F or F, d), experts_out (E, d, F)."""

    def __init__(self, moe: MoE, experts_in: QuantWeight, experts_out: QuantWeight):
        nn.Module.__init__(self)  # MoE.__init__ would allocate float experts
        for name in ("n_experts", "top_k", "kind", "gated", "score_func", "norm_topk", "aux_loss_coef"):
            setattr(self, name, getattr(moe, name))
        self.router = moe.router
        self.experts_in = experts_in
        self.experts_out = experts_out
        self.shared = moe.shared
        self.register_buffer("expert_bias", moe.expert_bias)
        self.register_buffer("load", moe.load, persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return moe_forward(self, x, lambda e, rows: self.experts_in.matmul(rows, e),
                           lambda e, rows: self.experts_out.matmul(rows, e))


def float_moe_forward(moe: MoE, x: torch.Tensor, record=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A float MoE through moe_forward; `record(which, e, rows)` sees every expert matmul's input."""
    def mm(which, weights):
        def run(e, rows):
            if record is not None:
                record(which, e, rows)
            return F.linear(rows, weights[e])
        return run
    return moe_forward(moe, x, mm("experts_in", moe.experts_in), mm("experts_out", moe.experts_out))


# ----------------------------------------------------------------------------- the model


class QuantizedTransformer(Transformer):
    """A Transformer with quantized modules swapped in; `quant_spec` records how (see spec.py).

    Only the output layer differs from Transformer: when it is quantized, logits come from the
    quantized matmul rather than F.linear over a dequantized copy."""

    linear_types = (nn.Linear, QuantLinear)  # QLoRA: LoRA wraps a quantized linear layer like a float one

    def to_float(self) -> Transformer:
        """Dequantize in place (dequantize_model): the model becomes a plain Transformer."""
        return dequantize_model(self)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        head = self.embed if self.lm_head is None else self.lm_head
        if isinstance(head, QuantEmbedding):
            logits = head.project(x).float()
        elif isinstance(head, QuantLinear):
            logits = head(x).float()
        else:
            return super().logits(x)
        cap = self.cfg.final_logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits


def dequantize_model(model: Transformer) -> Transformer:
    """Replace every quantized module by its float counterpart holding the dequantized weight (in the
    scales' dtype); the model becomes a plain Transformer (quant_spec removed). In place; returns it."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, QuantLinear):
                w = child.dequantize()
                new = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                device=w.device, dtype=w.dtype)
                with torch.no_grad():
                    new.weight.copy_(w)
                    if child.bias is not None:
                        new.bias.copy_(child.bias)
                setattr(module, child_name, new)
            elif isinstance(child, QuantEmbedding):
                w = child.dequantize()
                setattr(module, child_name, nn.Embedding.from_pretrained(w, freeze=False))
        if isinstance(module, QuantMoE):
            for leaf in ("experts_in", "experts_out"):
                w = getattr(module, leaf).dequantize()
                delattr(module, leaf)
                setattr(module, leaf, nn.Parameter(w))
            module.__class__ = MoE
    if isinstance(model, QuantizedTransformer):
        model.__class__ = Transformer
    if hasattr(model, "quant_spec"):
        del model.quant_spec
    return model
