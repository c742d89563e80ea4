"""Matmuls over quantized weights (y = x W^T for x (M, K)), and which implementation runs where.

Four implementations ("backends"), each for both formats (see formats.py):

    native    groundup's C++ kernels (native.py, built once per machine, then loaded in ~0.1 s). Up to
              NATIVE_ROWS rows (decoding): int8_mm / int4_mm read the integers once for all rows. More
              rows (prefill, calibration, QLoRA): F.linear (BLAS) over a float copy made in one pass:
              int8 converted to float with the scales applied to the output (as torchao does), int4
              dequantized by the native int4_dequant. Float32 activations only (else `compiled`).
    compiled  torch.compile'd kernels: the same split at SMALL_ROWS rows, a fused multiply-reduce over
              the integers below it, a compiled dequantize (int4) or conversion (int8) + F.linear above.
              Compiled anew in every process: seconds before the first token, even with inductor's
              on-disk cache warm (benchmarks/quant_first_use.py).
    packed    PyTorch's packed kernels: int8 `aten._weight_int8pack_mm` (CPU and CUDA; on CUDA, a
              GEMV, only up to SMALL_ROWS rows, cuBLAS over the dequantized weight above); int4
              `aten._weight_int4pack_mm_for_cpu` on CPU (weights converted once by
              `_convert_weight_to_int4pack_for_cpu`, scales and zeros as tinygemm's (K/g, N, 2)
              [scale, (8 - zero) * scale] table), `aten._weight_int4pack_mm` on CUDA (tinygemm,
              bfloat16 activations; weights converted by `_convert_weight_to_int4pack` from the
              high-nibble-first (N, K/2) layout, inner_k_tiles 8, 4 or 2, N padded to 8).
              The conversions follow torchao's usage (int4_opaque_tensor.py, int4_tile_packed_to_4d_tensor.py).
    dequant   dequantize to the activations' dtype, then F.linear, eagerly: the fallback.

`auto` (the default) is `native` on CPU where the C++ kernels build (else `compiled`) and `packed` on
CUDA. Chosen by measurement (benchmarks/quant_kernels.py, quant_table.py; 2-core AMD EPYC, one thread,
a shared machine; AVX-512 on the 2026-11-23 host, AVX2 only on earlier ones, where the native kernels
use their AVX2 path): the packed CPU kernels run 4-50x slower than fp32 F.linear
there (and so do torchao's int4 weight-only layers, which call them); at one row the native kernels
beat the compiled ones 1.6x (int8) and 3x (int4) and fp32 F.linear 2.5-5x on a d_model 640 block's
matmuls (whose weights do not fit in cache; a d_model 128 block's do, and gain 1.0-1.5x); at 8-16
rows they run 0.5-0.7x fp32 at d_model 128 and 0.9-1.9x at d_model 640. The compiled kernels cost
5-10 s of warm-up in every process (26-45 s with a cold inductor cache); the native ones a 10-15 s
build once per machine, then ~0.1 s to load (benchmarks/quant_first_use.py).

A path without a kernel (another device; torch.compile unavailable; the CPU int8 kernel with
bfloat16 activations and K not a multiple of 16, which it computes wrongly) falls back to
`dequant` with a one-time warning naming the shape and device.
"""

from __future__ import annotations

import types
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from groundup.config import ConfigError, did_you_mean
from groundup.quant import native
from groundup.quant.formats import dequantize_int4, dequantize_int8, unpack_int4

BACKENDS = ("auto", "native", "compiled", "packed", "dequant")
SMALL_ROWS = 4  # up to this many rows the compiled path multiplies and reduces in one pass
NATIVE_ROWS = 16  # up to this many rows (decoding, batched decoding) the native kernels run

_backend = "auto"
_compiled: dict[tuple, Callable] = {}
_broken: set[str] = set()
_warned: set[str] = set()


def set_kernel_backend(name: str) -> str:
    """Choose the backend for every quantized matmul in this process; returns the previous one."""
    global _backend
    if name not in BACKENDS:
        raise ConfigError(f"kernel backend {name!r} is unknown{did_you_mean(name, BACKENDS)}; "
                          f"expected one of {', '.join(BACKENDS)}", key="kernel")
    previous, _backend = _backend, name
    return previous


def get_kernel_backend() -> str:
    return _backend


def backend_for(device: torch.device) -> str:
    """The backend `auto` resolves to on `device`."""
    if _backend != "auto":
        return _backend
    if device.type == "cpu":
        return "native" if _native_ready() else "compiled"
    if device.type == "cuda":
        return "packed"
    return "dequant"


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


# ----------------------------------------------------------------------------- compiled kernels
#
# Shapes: the reduced dimension (K, and the group size) is static, so inductor's loops index with
# constants and vectorise; the row counts (M rows of x, N output channels) are dynamic, so one
# graph serves every layer with the same K. (Fully dynamic shapes made the int4 kernels 5-20x
# slower here: every element's index then needs divisions by runtime sizes.) Each K gets its own
# copy of the function, so torch.compile's per-function recompile limit is never reached.


def _int8_reduce(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (x.unsqueeze(-2) * q.to(x.dtype)).sum(-1) * s.to(x.dtype)


def _int4_reduce(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group_size: int) -> torch.Tensor:
    # Per group: sum_j x_j (q_j - z) s = s * (sum_j x_j q_j - z sum_j x_j); the low and high
    # nibbles of a packed group are its first and second halves, so both are contiguous runs.
    M, K = x.shape
    N = qweight.shape[0]
    G, h = K // group_size, group_size // 2
    p = qweight.view(N, G, h)
    xg = x.view(M, 1, G, 2, h)
    lo, hi = (p & 15).to(x.dtype), (p >> 4).to(x.dtype)
    part = (xg[:, :, :, 0] * lo).sum(-1) + (xg[:, :, :, 1] * hi).sum(-1) - xg.sum((-1, -2)) * zeros.to(x.dtype)
    return (part * scales.to(x.dtype)).sum(-1)


def _int8_dequant(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return q.to(dtype) * s.to(dtype).unsqueeze(-1)


def _int4_dequant_rows(p: torch.Tensor, s: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One packed group per row: p (R, g/2), s and z (R,) -> (R, g)."""
    s, z = s.to(dtype).unsqueeze(-1), z.to(dtype).unsqueeze(-1)
    return torch.cat([((p & 15).to(dtype) - z) * s, ((p >> 4).to(dtype) - z) * s], dim=-1)


def alias(t: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """A tensor over `t`'s memory (contiguous `t` when reshaping) that is not a view: torch.compile
    guards a view on its base, which would compile a kernel again for every base shape."""
    shape = tuple(t.shape) if shape is None else shape
    if torch.compiler.is_compiling():  # inside a compiled graph a view costs nothing and traces
        return t.reshape(shape)
    stride = t.stride() if shape == tuple(t.shape) else torch.empty(shape, device="meta").stride()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), shape, stride)


def _mark_rows(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if getattr(t, "_dynamo_weak_dynamic_indices", None) != {0}:
            torch._dynamo.maybe_mark_dynamic(t, 0)


def _run_compiled(fn: Callable, key: tuple, *args):
    """fn(*args) through torch.compile (inlined when already compiling); None if compiling failed.

    `key`: the static sizes the compiled copy specialises on; dimension 0 of every tensor
    argument is dynamic."""
    if torch.compiler.is_compiling():
        return fn(*args)
    name = fn.__name__
    if name in _broken:
        return None
    compiled = _compiled.get((name, key))
    if compiled is None:
        copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, f"{name}_{'_'.join(map(str, key))}",
                                  fn.__defaults__, fn.__closure__)
        compiled = _compiled[(name, key)] = torch.compile(copy, dynamic=False)
    _mark_rows(*(a for a in args if isinstance(a, torch.Tensor)))
    try:
        return compiled(*args)
    except Exception as e:  # noqa: BLE001 - no C++ compiler, an inductor bug: fall back, once, loudly
        _broken.add(name)
        warn_once(f"compile:{name}", f"compiled quantized kernel {name} is unavailable here "
                  f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); using dequantize-then-matmul")
        return None


def _compiled_dequant_int8(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    return _run_compiled(_int8_dequant, (q.shape[-1],), q, s, dtype)


def _compiled_dequant_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                           dtype: torch.dtype) -> torch.Tensor | None:
    N, half = qweight.shape
    G = scales.shape[-1]
    h = half // G
    w = _run_compiled(_int4_dequant_rows, (2 * h,), alias(qweight, (N * G, h)), alias(scales, (N * G,)),
                      alias(zeros, (N * G,)), dtype)
    return None if w is None else w.view(N, 2 * half)


# ----------------------------------------------------------------------------- packed kernels


def _prepared(cache: dict | None, key: tuple, build: Callable[[], tuple]) -> tuple:
    if cache is None:
        return build()
    value = cache.get(key)
    if value is None:
        with torch.inference_mode(False), torch.no_grad():  # usable inside and outside inference mode
            value = cache[key] = build()
    return value


def _packed_int8(x, qweight, scales):
    dtype, (M, K) = x.dtype, x.shape
    if x.device.type == "cpu" and dtype == torch.bfloat16 and K % 16:
        return None  # the CPU kernel reads out of bounds for bf16 with K % 16 != 0
    if x.device.type == "cuda" and M > SMALL_ROWS:
        # CUDA's kernel is a GEMV (a warp per output): for prefill, cuBLAS on the dequantized weight
        return F.linear(x, dequantize_int8(qweight, scales, dtype))
    return torch.ops.aten._weight_int8pack_mm(x.contiguous(), qweight, scales.to(dtype))


def _cpu_int4_tables(qweight, scales, zeros, group_size, dtype):
    q = unpack_int4(qweight, group_size).to(torch.int32)
    N = q.shape[0]
    pad = -N % 16  # the CPU packing wants N a multiple of 16: pad with zero rows, slice them off after
    s, z = scales.float(), zeros.float()
    if pad:
        q = F.pad(q, (0, 0, 0, pad))
        s, z = F.pad(s, (0, 0, 0, pad)), F.pad(z, (0, 0, 0, pad))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)  # inner_k_tiles: unused on CPU
    table = torch.stack([s, (8 - z) * s], dim=-1).transpose(0, 1).contiguous().to(dtype)  # (G, N, 2)
    return packed, table


def _cuda_int4_tables(qweight, scales, zeros, group_size):
    q = unpack_int4(qweight, group_size)
    N, K = q.shape
    pad = -N % 8
    s, z = scales.float(), zeros.float()
    if pad:
        q = F.pad(q, (0, 0, 0, pad))
        s, z = F.pad(s, (0, 0, 0, pad)), F.pad(z, (0, 0, 0, pad))
    u8 = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8).contiguous()
    inner_k_tiles = 8 if K % 128 == 0 else 4 if K % 64 == 0 else 2
    packed = torch.ops.aten._convert_weight_to_int4pack(u8, inner_k_tiles)
    table = torch.stack([s, (8 - z) * s], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return packed, table


def _packed_int4(x, qweight, scales, zeros, group_size, cache, key):
    N = scales.shape[0]
    if x.device.type == "cpu":
        packed, table = _prepared(cache, ("cpu_int4", *key, x.dtype),
                                  lambda: _cpu_int4_tables(qweight, scales, zeros, group_size, x.dtype))
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), packed, group_size, table)
        return y[:, :N]
    if x.device.type == "cuda":
        packed, table = _prepared(cache, ("cuda_int4", *key), lambda: _cuda_int4_tables(qweight, scales, zeros, group_size))
        y = torch.ops.aten._weight_int4pack_mm(x.to(torch.bfloat16).contiguous(), packed, group_size, table)
        return y[:, :N].to(x.dtype)
    return None


def _try_packed(fn: Callable, what: str, *args):
    try:
        return fn(*args)
    except (RuntimeError, NotImplementedError, AttributeError, TypeError) as e:  # an op this torch lacks
        if args[0].device.type == "cpu":
            raise  # the CPU kernels exist in every build: an error here is a bug to see
        warn_once(f"packed-fail:{what}", f"packed kernel for {what} failed ({str(e).splitlines()[0]}); "
                  "using dequantize-then-matmul")
        return None


# ----------------------------------------------------------------------------- native kernels


def _native_ready(build: bool = True) -> bool:
    """Whether the native kernels are loaded; builds them on first use, never while torch.compile traces."""

    if native.ready() or not build or torch.compiler.is_compiling():
        return native.ready()
    if not native.available():
        warn_once("native", f"native quantized kernels are unavailable ({native.why_unavailable()}); "
                  "using the compiled kernels")
    return native.ready()


def _native(x: torch.Tensor, fmt: str, *tensors) -> torch.Tensor | None:
    """The native kernels' product for float32 activations on the CPU (else None): up to NATIVE_ROWS rows
    the integer matmul; more rows (prefill, training), F.linear over the float weight, int4's made by the
    native dequantize, int8's converted (the scales go on the output), none of them compiled."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or not _native_ready():
        return None
    if tensors[1].dtype != torch.float32:  # scales cast to half precision: not this kernel's
        return None
    if fmt == "int8":
        if x.shape[0] > NATIVE_ROWS:
            return F.linear(x, tensors[0].to(x.dtype)) * tensors[1]
        return torch.ops.groundup_quant.int8_mm(x, *tensors)
    group_size = 2 * tensors[0].shape[-1] // tensors[1].shape[-1]
    if x.shape[0] > NATIVE_ROWS:
        return F.linear(x, torch.ops.groundup_quant.int4_dequant(*tensors, group_size))
    if group_size % 32:
        return None
    return torch.ops.groundup_quant.int4_mm(x, *tensors, group_size)


def _native_dequant_int4(qweight, scales, zeros, dtype) -> torch.Tensor | None:
    if qweight.device.type != "cpu" or scales.dtype != torch.float32 or not _native_ready():
        return None
    w = torch.ops.groundup_quant.int4_dequant(qweight, scales, zeros, 2 * qweight.shape[-1] // scales.shape[-1])
    return w.to(dtype)


# ----------------------------------------------------------------------------- entry points


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (M, K) @ dequantize(qweight (N, K) int8, scales (N,))^T -> (M, N) in x's dtype."""
    backend = backend_for(x.device)
    y = _native(x, "int8", qweight, scales) if backend == "native" else None
    if backend == "native" and y is None:
        backend = "compiled"
    if backend == "compiled":
        if x.shape[0] <= SMALL_ROWS:
            y = _run_compiled(_int8_reduce, (x.shape[1],), x, qweight, scales)
        else:  # one conversion pass over the weight; the scales go on the (smaller) output
            y = F.linear(x, qweight.to(x.dtype)) * scales.to(x.dtype)
    elif backend == "packed":
        y = _try_packed(_packed_int8, f"int8 {tuple(qweight.shape)} on {x.device}", x, qweight, scales)
        if y is None:
            warn_once(f"nokernel:int8:{tuple(qweight.shape)}:{x.device}:{x.dtype}",
                      f"no packed int8 kernel for weight {tuple(qweight.shape)} with {x.dtype} activations on "
                      f"{x.device}; using dequantize-then-matmul")
    if y is None:
        if backend == "dequant" and x.device.type not in ("cpu", "cuda") and _backend == "auto":
            warn_once(f"nodev:{x.device.type}", f"no quantized kernel for device {x.device.type}; "
                      "using dequantize-then-matmul")
        y = F.linear(x, dequantize_int8(qweight, scales, x.dtype))
    return y


def int4_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                cache: dict | None = None, key: tuple = ()) -> torch.Tensor:
    """x (M, K) @ dequantize(int4 qweight (N, K/2), scales, zeros (N, K/g))^T -> (M, N) in x's dtype.

    `cache` (a dict the weight's owner keeps) holds the packed kernels' converted weights under `key`."""
    group_size = 2 * qweight.shape[-1] // scales.shape[-1]
    backend = backend_for(x.device)
    y = _native(x, "int4", qweight, scales, zeros) if backend == "native" else None
    if backend == "native" and y is None:
        backend = "compiled"
    if backend == "compiled":
        if x.shape[0] <= SMALL_ROWS:
            y = _run_compiled(_int4_reduce, (x.shape[1], group_size), x, qweight, scales, zeros, group_size)
        else:
            w = _compiled_dequant_int4(qweight, scales, zeros, x.dtype)
            y = None if w is None else F.linear(x, w)
    elif backend == "packed":
        what = f"int4 {(scales.shape[0], 2 * qweight.shape[-1])} g{group_size} on {x.device}"
        y = _try_packed(_packed_int4, what, x, qweight, scales, zeros, group_size, cache, key)
        if y is None:
            warn_once(f"nokernel:{what}", f"no packed int4 kernel for weight {what}; using dequantize-then-matmul")
    if y is None:
        if backend == "dequant" and x.device.type not in ("cpu", "cuda") and _backend == "auto":
            warn_once(f"nodev:{x.device.type}", f"no quantized kernel for device {x.device.type}; "
                      "using dequantize-then-matmul")
        y = F.linear(x, dequantize_int4(qweight, scales, zeros, group_size, x.dtype))
    return y


def dequantize(fmt: str, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
               dtype: torch.dtype) -> torch.Tensor:
    """The float weight: int4 through the native kernel (`native`) or in one compiled pass (`compiled`)."""
    backend = backend_for(qweight.device)
    if fmt == "int8":
        w = _compiled_dequant_int8(qweight, scales, dtype) if backend == "compiled" and qweight.dim() == 2 else None
        return w if w is not None else dequantize_int8(qweight, scales, dtype)
    w = None
    if qweight.dim() == 2:  # stacked experts: eagerly
        if backend == "native":
            w = _native_dequant_int4(qweight, scales, zeros, dtype)
        if backend == "compiled" or (backend == "native" and w is None):
            w = _compiled_dequant_int4(qweight, scales, zeros, dtype)
    group_size = 2 * qweight.shape[-1] // scales.shape[-1]
    return w if w is not None else dequantize_int4(qweight, scales, zeros, group_size, dtype)
