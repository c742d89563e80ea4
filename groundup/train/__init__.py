"""The training core and pretraining: `groundup train` and `train(cfg, out_dir, resume=False)`.

    state.py        TrainState (every field a run carries between steps), build_state, save/restore
    objective.py    the objective interface (a batch -> loss + metrics) and NextTokenObjective
    step.py         one optimizer step of any objective: micro-batches, loss scaling, clipping, skip or update
    loop.py         the shared loop: resume, logging, evaluation, checkpoints, rollback, summary
    pretrain.py     train(): token shards + the next-token objective on the core
    config.py       TrainConfig: model, data, train, optim, schedule, precision, checkpoint, stability, eval, log, distributed
    run.py          the run directory: config, tokenizer copy, fresh-or-resume checks
    optimizers.py   AdamW, Muon (+ AdamW), Lion and their parameter groups
    schedules.py    warmup + cosine, WSD, constant; set before each optimizer step
    precision.py    fp32, bf16 autocast, bf16 compute weights with fp32 master weights
    checkpoint.py   atomic step directories, checksums, rotation, fallback, loader re-sharding
    distributed.py  torchrun: DDP or FSDP2, full state dicts that load into any layout
    stability.py    data gate, spike skipping, rollback trigger
    metrics.py      metrics.jsonl, progress bar, TensorBoard/W&B, MFU
    commands.py     the CLI verb
"""

from groundup.train.config import TrainConfig
from groundup.train.pretrain import train

__all__ = ["TrainConfig", "train"]
