"""GPUs the plan knows: memory and dense peak FLOP/s from the vendors' datasheets.

Peaks are dense (not the 2:4-sparsity figures datasheets print beside them). `fp32` is the plain
FP32 rate: groundup does not turn on TF32, so fp32 matmuls run at it; `tf32` is listed for
reference. Memory is what the device reports to CUDA (nvidia-smi's MiB), slightly less than
the marketing GB for some parts.

    A100 SXM4        datasheet: 312 TFLOP/s BF16 dense, 156 TF32, 19.5 FP32; 40 or 80 GB HBM
    H100 SXM5        989 BF16 dense, 495 TF32, 67 FP32; 80 GB HBM3
    H100 PCIe        756 BF16 dense, 378 TF32, 51 FP32; 80 GB HBM2e
    H200 SXM         989 BF16 dense, 495 TF32, 67 FP32; 141 GB HBM3e
    L40S             362 BF16 dense (FP32 accumulate), 183 TF32, 91.6 FP32; 48 GB GDDR6
    L4               121 BF16 dense, 60 TF32, 30.3 FP32; 24 GB GDDR6
    A10G (AWS g5)    70 BF16 dense, 35 TF32, 31.2 FP32; 24 GB GDDR6
    RTX 4090         165 BF16 dense with FP32 accumulate, 82.6 TF32, 82.6 FP32; 24 GB GDDR6X
    RTX 3090         71 BF16 dense with FP32 accumulate, 35.6 TF32, 35.6 FP32; 24 GB GDDR6X
    V100 SXM2        125 FP16 tensor (no BF16), 15.7 FP32; 32 GB HBM2
    MI300X           1307 BF16 dense, 654 TF32, 163 FP32 (matrix); 192 GB HBM3
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from groundup.config import did_you_mean
from groundup.errors import ConfigError

MIB = 2**20
T = 1e12


@dataclass(frozen=True)
class GPU:
    name: str  # the key users type
    label: str
    memory_bytes: float
    bf16: float  # dense peak FLOP/s; 0: no bf16
    tf32: float
    fp32: float

    def peak(self, bf16: bool) -> float:
        return self.bf16 if bf16 else self.fp32

    def to_dict(self) -> dict:
        return asdict(self)


GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("a100-80gb", "NVIDIA A100 SXM4 80GB", 81920 * MIB, 312 * T, 156 * T, 19.5 * T),
    GPU("a100-40gb", "NVIDIA A100 SXM4 40GB", 40960 * MIB, 312 * T, 156 * T, 19.5 * T),
    GPU("h100", "NVIDIA H100 SXM5 80GB", 81559 * MIB, 989.4 * T, 494.7 * T, 66.9 * T),
    GPU("h100-pcie", "NVIDIA H100 PCIe 80GB", 81559 * MIB, 756 * T, 378 * T, 51.2 * T),
    GPU("h200", "NVIDIA H200 SXM 141GB", 143771 * MIB, 989.4 * T, 494.7 * T, 66.9 * T),
    GPU("l40s", "NVIDIA L40S 48GB", 46068 * MIB, 362.05 * T, 183 * T, 91.6 * T),
    GPU("l4", "NVIDIA L4 24GB", 23034 * MIB, 121 * T, 60 * T, 30.3 * T),
    GPU("a10g", "NVIDIA A10G 24GB", 23028 * MIB, 70 * T, 35 * T, 31.2 * T),
    GPU("rtx4090", "NVIDIA GeForce RTX 4090 24GB", 24564 * MIB, 165.2 * T, 82.6 * T, 82.6 * T),
    GPU("rtx3090", "NVIDIA GeForce RTX 3090 24GB", 24576 * MIB, 71 * T, 35.6 * T, 35.6 * T),
    GPU("v100", "NVIDIA V100 SXM2 32GB", 32768 * MIB, 0.0, 0.0, 15.7 * T),
    GPU("mi300x", "AMD Instinct MI300X 192GB", 196608 * MIB, 1307.4 * T, 653.7 * T, 163.4 * T),
)}

ALIASES = {"a100": "a100-80gb", "h100-sxm": "h100", "h100-80gb": "h100", "h200-141gb": "h200", "4090": "rtx4090",
           "rtx-4090": "rtx4090", "3090": "rtx3090", "rtx-3090": "rtx3090", "l40s-48gb": "l40s"}


def get_gpu(name: str) -> GPU:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    hint = did_you_mean(key, [*GPUS, *ALIASES], cutoff=0.5)
    raise ConfigError(f"--gpu {name!r}: unknown GPU{hint}; known: {', '.join(GPUS)}", key="gpu")
