"""Which device and dtype a command runs on: one resolver for every verb and the training core.

    resolve_device("auto")                       # cuda when torch sees a GPU, else cpu
    resolve_device("cuda", local_rank=3)         # cuda:3 (torchrun: each process its own GPU)
    resolve_dtype("bf16")                        # torch.bfloat16

Asking for a device torch cannot run here (mps, xla:0, cuda:7 on a 1-GPU machine) is a ConfigError naming the
flag or key and the devices that are available, not a crash later.
"""

from __future__ import annotations

import torch

from groundup.errors import ConfigError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype, key: str = "dtype") -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"{key} = {dtype!r}: expected one of {', '.join(DTYPES)}", key=key)
    return DTYPES[dtype]


def available_devices() -> list[str]:
    """The devices this torch can run groundup on: cpu, then cuda:0 ... cuda:N-1."""
    return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]


def _refuse(key: str, device, why: str) -> ConfigError:
    shown = f"{key} {device!r}" if key.startswith("--") else f"{key} = {device!r}"
    return ConfigError(f"{shown}: {why}; available here: auto, {', '.join(available_devices())}", key=key)


def resolve_device(device: str | torch.device, local_rank: int | None = None, key: str = "--device") -> torch.device:
    """`auto` picks CUDA when present. With `local_rank` (a torchrun process), `auto` and a bare `cuda`
    mean that process's own GPU, cuda:LOCAL_RANK. Anything else this machine cannot run on (another
    backend, a GPU index it lacks, a malformed name) is a ConfigError naming `key` (the flag or config
    key the user set) and the devices that are available."""
    if str(device) == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda" if local_rank is None else f"cuda:{local_rank}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise _refuse(key, device, "not a device name (expected auto, cpu, cuda or cuda:N)") from None
    if resolved.type not in ("cpu", "cuda"):
        raise _refuse(key, device, f"groundup runs on cpu or cuda, not {resolved.type}")
    if resolved.type == "cpu" and resolved.index not in (None, 0):
        raise _refuse(key, device, "there is one cpu device")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise _refuse(key, device, "this torch sees no CUDA device")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise _refuse(key, device, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
        if resolved.index is None and local_rank is not None:
            resolved = torch.device(f"cuda:{local_rank}")
    return resolved
