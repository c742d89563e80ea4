"""Which device and dtype a command runs on: one resolver for every verb and the training core.

    resolve_device("auto")                       # cuda when torch sees a GPU, else cpu
    resolve_device("cuda", local_rank=3)         # cuda:3 (torchrun: each process its own GPU)
    resolve_dtype("bf16")                        # torch.bfloat16

Asking for a CUDA device that torch cannot see is a ConfigError naming the key, not a crash later.
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


def resolve_device(device: str | torch.device, local_rank: int | None = None, key: str = "device") -> torch.device:
    """`auto` picks CUDA when present. With `local_rank` (a torchrun process), `auto` and a bare `cuda`
    mean that process's own GPU, cuda:LOCAL_RANK."""
    if str(device) == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda" if local_rank is None else f"cuda:{local_rank}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{key} = {device!r}: expected auto, cpu, cuda or cuda:N", key=key) from None
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"{key} = {device!r}: groundup runs on cpu or cuda (auto picks)", key=key)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key} = {device!r}: this torch sees no CUDA device (use cpu)", key=key)
        if resolved.index is None and local_rank is not None:
            resolved = torch.device(f"cuda:{local_rank}")
    return resolved
