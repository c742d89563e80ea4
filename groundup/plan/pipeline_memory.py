"""Memory per GPU of one training step under pipeline parallelism (train/pipeline.py): the largest stage's.

Each GPU holds pp x v-th of the blocks (v stages per GPU: 1 for 1F1B and GPipe, 2 by default for
interleaved 1F1B), the first stage also the embedding and the last the final norm and output layer,
sharded by FSDP2 over the gpus / pp GPUs of a stage. A loader micro-batch of `batch` sequences is split
into `m` pipeline micro-batches (distributed.pp_microbatches; default pp) of batch / m sequences; with
grad_accum the step runs M = m x grad_accum of them. What a schedule keeps at its fullest moment is
the activations of the (stage, micro-batch) pairs whose forward ran and whose backward has not:
    GPipe            every one: M per stage
    1F1B             pp - p on pipeline rank p (its warm-up forwards, then one forward per backward)
    interleaved 1F1B (v - 1) pp + 2 (pp - 1 - p) + 1 stage forwards on rank p (torch's warm-up count)
each capped by M x v. The last stage's output layer returns float32 logits (the pipeline's loss is
not the fused chunked kernel), and cross-entropy keeps them and their softmax for backward.
"""

from __future__ import annotations

from groundup.plan.activations import FP32, Layout, block_backward_extra, block_saved, forward_extra
from groundup.plan.params import param_split


def in_flight(schedule: str, pp: int, rank: int, microbatches: int, v: int) -> int:
    """Stage forwards whose backward has not run yet at the fullest moment of pipeline rank `rank`."""
    if schedule == "gpipe":
        return microbatches * v
    if schedule == "interleaved_1f1b":
        return min(microbatches * v, (v - 1) * pp + 2 * (pp - 1 - rank) + 1)
    return min(microbatches, pp - rank)


def pipeline_moments(s) -> list[tuple[str, float, dict[str, float]]]:
    """Each pipeline rank's fullest moment: (name, parameters its optimizer holds, bytes by part but the
    optimizer's); memory.step_memory adds the optimizer state and takes the largest (when s.pp > 1)."""
    cfg, num = s.model, s.num
    ps = param_split(cfg)
    L, T, V = cfg.n_layers, s.seq, cfg.vocab_size
    v = s.pp_virtual or (2 if s.pp_schedule == "interleaved_1f1b" else 1)
    m = s.pp_microbatches or s.pp
    M = m * s.accum
    b = s.batch / m
    dp = max(1, s.shard)
    per_stage = L // (s.pp * v)
    lay = Layout(1, False, s.device)
    w = num.weight
    moments = []
    for rank in range(s.pp):
        stages = [rank + i * s.pp for i in range(v)]
        layers = [st * per_stage + j for st in stages for j in range(per_stage)]
        first, last = 0 in stages, s.pp * v - 1 in stages
        blocks = [ps.blocks[i]["total"] for i in layers]
        root = (ps.embed if first else 0) + ((ps.lm_head or ps.embed) + ps.final_norm if last else 0)
        params = sum(blocks) + root
        saved = [sum(block_saved(cfg, i, b, T, num, lay).values()) if not s.checkpointing else
                 block_saved(cfg, i, b, T, num, lay)["block_input"] for i in layers]
        per_forward = sum(saved) / v  # one stage's forward of one micro-batch
        k = in_flight(s.pp_schedule, s.pp, rank, M, v)
        rows = b * T
        logits = 3 * rows * V * FP32 if last else 0.0  # float32 logits, their softmax and its gradient
        extra = max(block_backward_extra(cfg, i, b, T, num, lay) for i in layers)
        extra = max(extra, forward_extra(cfg, b, T, num, lay))
        largest = max(blocks)
        # FSDP: the current block and the prefetched one unsharded, a block's gradient and its
        # reduce-scatter input; the stage's own root parameters unsharded through forward and backward
        temps = (2 * largest * w + largest * (w + FP32) + root * w) if dp > 1 else 0.0
        parts = {"weights": params * FP32 / dp, "master_weights": 0.0, "gradients": params * FP32 / dp,
                 "activations": k * per_forward + extra, "loss": logits, "temporaries": temps}
        moments.append((f"pp rank {rank}, {k} in flight", params / dp, parts))
    return moments
