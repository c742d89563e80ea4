"""The training core and pretraining: `groundup train` and `train(cfg, out_dir, resume=False)`. Every
post-training verb (groundup.posttrain) runs on the same core with an objective of its own.

    session.py       open_run: the one run session every training verb uses (process group, writer lock,
                     fresh-or-resume checks, base model or shards' tokenizer, config commit, then the loop)
    state.py         TrainState (every field a run carries between steps), build_state, save/restore
    objective.py     the objective interface (a batch -> loss + metrics) and NextTokenObjective
    step.py          one optimizer step of any objective: micro-batches, loss scaling, clipping, skip or update
    loop.py          training_session and the shared loop: resume, logging, evaluation, checkpoints, rollback
    pretrain.py      train(): token shards + the next-token objective on the core
    run.py           pretraining's start: the shards' tokenizer and vocabulary, checked before anything is written
    config.py        TrainConfig and the sections every training verb shares (train, optim, schedule, precision,
                     checkpoint, stability, eval, log, distributed); resume compatibility
    optimizers.py    AdamW, Muon (+ AdamW), Lion and their parameter groups
    schedules.py     warmup + cosine, WSD, constant; set before each optimizer step
    precision.py     fp32, bf16 autocast, bf16 compute weights with fp32 master weights
    checkpoint.py    atomic step directories, checksums, rotation, fallback, loader re-sharding
    dcp.py           sharded checkpoints of FSDP2 and tensor-parallel runs (torch.distributed.checkpoint)
    distributed.py   torchrun: DDP, FSDP2 or FSDP2 x TP; full state dicts that load into any layout
    parallelize.py   tensor parallelism on DTensor: fused projections split, sequence parallelism
    mesh.py          the named device mesh of HSDP and pipelined runs: (pp, replicate x shard | dp, tp)
    pipeline.py      pipeline parallelism: stages cut by hand, GPipe / 1F1B / interleaved 1F1B, the bubble
    expert_parallel.py  expert parallelism: MoE experts split over ranks, tokens exchanged all-to-all
    stability.py     data gate, spike skipping, rollback trigger
    hang.py          the hang detector (stacks to RUN/hang-rank{R}.txt, a non-zero exit) and injected test faults
    time_budget.py   train.time_limit_s: max_steps and cadences re-planned from measured step times
    threads.py       the CPU thread count measured rather than assumed (`train.threads = -1`)
    metrics.py       metrics.jsonl, progress bar, TensorBoard/W&B, MFU and HFU (never above 100%)
    flops.py         the FLOPs a step does: LoRA, frozen layers, recomputed activations
    peak.py          peak FLOP/s: the GPU table, or a quiet CPU/GPU calibration cached per machine
    commands.py      `groundup train`
"""

from groundup.train.config import TrainConfig
from groundup.train.pretrain import train

__all__ = ["TrainConfig", "train"]
