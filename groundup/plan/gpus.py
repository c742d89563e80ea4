"""GPUs the plan knows: memory and dense peak FLOP/s from the vendors' datasheets.

The table itself lives in groundup/train/peak.py, with the datasheet figures: a training run reports
its MFU against the same peaks the plan assumes. Here: the names users type for them.
"""

from __future__ import annotations

from groundup.config import did_you_mean
from groundup.errors import ConfigError
from groundup.train.peak import GPU, GPUS

__all__ = ["ALIASES", "GPU", "GPUS", "get_gpu"]

ALIASES = {"a100": "a100-80gb", "h100-sxm": "h100", "h100-80gb": "h100", "h200-141gb": "h200", "4090": "rtx4090",
           "rtx-4090": "rtx4090", "3090": "rtx3090", "rtx-3090": "rtx3090", "l40s-48gb": "l40s"}


def get_gpu(name: str) -> GPU:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    hint = did_you_mean(key, [*GPUS, *ALIASES], cutoff=0.5)
    raise ConfigError(f"--gpu {name!r}: unknown GPU{hint}; known: {', '.join(GPUS)}", key="gpu")
