"""`groundup plan`: memory per GPU, the largest micro-batch that fits, time and GPU hours of a run.

    from groundup.plan import plan
    p = plan(cfg, gpus=8, gpu="a100-80gb", tokens=1e12, mfu=0.4)   # cfg: a TrainConfig
    p.strategy("fsdp").peak_bytes, p.strategy("fsdp").parts, p.strategy("fsdp").max_micro_batch
    p.tokens_per_sec_per_gpu, p.step_time_s, p.total_time_s, p.gpu_hours, p.to_dict()

Modules: gpus (the GPU table), params (parameter counts per FSDP unit), activations (bytes the
ops keep for backward, the fused loss), memory (the step's timeline and its peak per strategy),
estimate (plan(), the largest micro-batch, time), report (the table), measure (peak tensor
memory of a CPU process, for checking the model), commands (the CLI verb).
"""

from groundup.plan.estimate import STRATEGIES, Params, Plan, StrategyPlan, plan, predict_memory
from groundup.plan.gpus import GPU, GPUS, get_gpu
from groundup.plan.memory import ACCUMULATION, Memory

__all__ = ["ACCUMULATION", "GPU", "GPUS", "Memory", "Params", "Plan", "STRATEGIES", "StrategyPlan", "get_gpu", "plan",
           "predict_memory"]
