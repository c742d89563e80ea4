"""Native CPU kernels for quantized matmuls: int8 and int4 weights read once, in C++ (native_src.py).

    from groundup.quant import native
    if native.available():          # loads the build cached for this CPU; builds it once (~10 s) if none
        y = torch.ops.groundup_quant.int8_mm(x, qweight, scales)                 # x (M, K) float32
        y = torch.ops.groundup_quant.int4_mm(x, qweight, scales, zeros, group_size)
        w = torch.ops.groundup_quant.int4_dequant(qweight, scales, zeros, group_size)  # (N, K) float32

int8_mm / int4_mm: y = x @ dequantize(W)^T in float32, for the few rows of decoding (any M works;
kernels.py sends M <= NATIVE_ROWS here). The weight is read once for all M rows, in tiles of 4
output channels:

- M = 1: the integers are converted in registers and multiplied straight away (AVX2 + FMA: 8 lanes;
  int4 unpacks each byte's two nibbles, which the planar layout puts 8 or more columns apart, so
  both halves meet contiguous activations; the zero point costs one multiply per group, through
  the activations' group sums).
- M > 1: a tile is dequantized into a small float buffer (in L1) that then serves every row.

int4_dequant: the float weight in one pass, for many rows (prefill, QLoRA's backward pass), where
BLAS over it beats any of the above; as fast as a torch.compile'd dequantize, without its warm-up.

Threads: ATen's intra-op pool (torch.set_num_threads), over output tiles. Without AVX2/FMA at build
time the same loops compile as scalar code (correct, slow). The ops are registered with the
dispatcher (TORCH_LIBRARY), so torch.compile'd graphs call them as opaque kernels: the integer
weights stay integers there too, where inductor's freezing would otherwise constant-fold a
dequantize into a float copy of every weight.

The build: torch.utils.cpp_extension into its cache (TORCH_EXTENSIONS_DIR, default
~/.cache/torch_extensions), once per machine; every later process only loads it (~0.1 s). It uses
-march=native and its name carries a digest of the CPU's flags, the source and torch's version, so a
cache shared between machines never runs the wrong code. A build lock left by a process killed while
building (cpp_extension would wait for it forever) is removed once it is older than STALE_LOCK_S; a
fresh one (another process building now) is waited for up to LOCK_WAIT_S, then this process goes on
without the kernels. If no C++ toolchain is present, `available()` is False and kernels.py uses its
other paths. GROUNDUP_NATIVE_KERNELS=0 never builds nor loads them.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
import warnings
from pathlib import Path

import torch

from groundup.quant.native_src import SOURCE

NAMESPACE = "groundup_quant"
STALE_LOCK_S = 600.0  # a build takes well under a minute; a lock this old was left by a killed build
LOCK_WAIT_S = 180.0

_lock = threading.Lock()
_state: dict[str, object] = {}


def _cpu_digest() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    return hashlib.sha256((flags + SOURCE + torch.__version__).encode()).hexdigest()[:12]


def extension_name() -> str:
    return f"{NAMESPACE}_{_cpu_digest()}"


def available() -> bool:
    """Whether the kernels are loaded; the first call loads the cached build, or builds it."""
    if "ok" in _state:
        return bool(_state["ok"])
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        if os.environ.get("GROUNDUP_NATIVE_KERNELS", "1") == "0":
            _state["ok"], _state["why"] = False, "GROUNDUP_NATIVE_KERNELS=0"
            return False
        try:
            _load()
            _register_fakes()
            _state["ok"] = True
        except Exception as e:  # noqa: BLE001 - no compiler, no headers: the other paths remain
            _state["ok"], _state["why"] = False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return bool(_state["ok"])


def _load() -> None:
    from torch.utils import cpp_extension

    name = extension_name()
    build = Path(cpp_extension._get_build_directory(name, verbose=False))
    source = build / f"{NAMESPACE}.cpp"
    built = (build / f"{name}.so").is_file() and source.is_file() and source.read_text() == SOURCE
    if not _wait_for_lock(build / "lock"):
        raise RuntimeError(f"another process has been building them for {LOCK_WAIT_S:.0f} s ({build / 'lock'})")
    if not built:
        tmp = source.with_name(f".{source.name}.{os.getpid()}")
        tmp.write_text(SOURCE)
        os.replace(tmp, source)  # atomic: a concurrent builder reads the whole file or the same one
        print(f"building groundup's native quantized CPU kernels for this CPU in {build} (once per machine)...",
              file=sys.stderr, flush=True)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpp_extension.load(name, sources=[str(source)], extra_cflags=["-O3", "-march=native"],
                           build_directory=str(build), is_python_module=False, verbose=False)
    if not built:
        print(f"built them in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)


def _wait_for_lock(lock: Path) -> bool:
    """False if another process holds the build lock for more than LOCK_WAIT_S; a stale lock is removed."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return True
        if age > STALE_LOCK_S:
            lock.unlink(missing_ok=True)
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def ready() -> bool:
    """Whether the kernels are loaded, without building them (safe while torch.compile traces)."""
    return bool(_state.get("ok"))


def why_unavailable() -> str | None:
    return _state.get("why")  # type: ignore[return-value]


def _register_fakes() -> None:
    """Shapes for tracing (torch.compile), so compiled graphs call the kernels as opaque ops."""
    @torch.library.register_fake(f"{NAMESPACE}::int8_mm")
    def _(x, qweight, scales):
        return x.new_empty((x.shape[0], qweight.shape[0]))

    @torch.library.register_fake(f"{NAMESPACE}::int4_mm")
    def _(x, qweight, scales, zeros, group_size):
        return x.new_empty((x.shape[0], qweight.shape[0]))

    @torch.library.register_fake(f"{NAMESPACE}::int4_dequant")
    def _(qweight, scales, zeros, group_size):
        return scales.new_empty((qweight.shape[0], 2 * qweight.shape[1]))
