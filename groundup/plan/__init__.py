"""`groundup plan`: memory per GPU, the largest micro-batch that fits, time and GPU hours of a run.

    from groundup.plan import plan
    p = plan(cfg, gpus=8, gpu="a100-80gb", tokens=1e12, mfu=0.4)   # cfg: a TrainConfig
    p.strategy("fsdp").peak_bytes, p.strategy("fsdp").parts, p.strategy("fsdp").max_micro_batch
    p.tokens_per_sec_per_gpu, p.step_time_s, p.total_time_s, p.gpu_hours, p.to_dict()

    estimate.py      plan(): each strategy's memory per GPU, the largest micro-batch that fits, time at an MFU
    memory.py        one step's memory per GPU as a timeline of parts, its peak, for DDP / FSDP2 / HSDP / FSDP2 + TP
    activations.py   the bytes a block's ops keep for backward, and the fused loss's, per precision
    params.py        parameter counts per FSDP unit, split into what tensor parallelism divides and replicates
    gpus.py          the GPU table: memory and dense peak FLOP/s from the datasheets
    report.py        the table `groundup plan` prints
    measure.py       peak tensor memory of a CPU process from profiler events, to check the memory model
    pipeline_memory.py  a pipeline stage's memory: its shard of the parameters, the schedule's micro-batches in flight
    layouts.py       measured peaks of HSDP, pipeline and expert-parallel layouts on gloo, against the estimate
    commands.py      `groundup plan`
"""

from groundup.plan.estimate import STRATEGIES, Params, Plan, StrategyPlan, plan, predict_memory
from groundup.plan.gpus import GPU, GPUS, get_gpu
from groundup.plan.memory import ACCUMULATION, Memory

__all__ = ["ACCUMULATION", "GPU", "GPUS", "Memory", "Params", "Plan", "STRATEGIES", "StrategyPlan", "get_gpu", "plan",
           "predict_memory"]
