"""Memory per GPU of one training step, by part, for DDP, FSDP2 (full shard, hybrid), FSDP2 + TP, expert
parallelism (under DDP or FSDP2) and pipeline stages (pipeline_memory.py).

The step is walked as a timeline and the peak is the largest total over its moments: the end of
the forward pass (the fused loss at work), the backward pass of each block, the root module's
backward end (FSDP reduce-scatters the embedding and output layer last) and the optimizer step.
Each moment sums the parts that exist then:

    weights          what each GPU stores: DDP the whole model (bf16-weights: the bf16 compute copy),
                     FSDP its fp32 shard (which is also the master copy)
    master_weights   DDP/one GPU with bf16-weights: the separate fp32 master model
    gradients        DDP: one per parameter (fp32, or bf16 + fp32 master with bf16-weights); FSDP:
                     the fp32 shard, plus, with gradient accumulation, what groundup's step does
                     today: no reduce-scatter before the last micro-batch (set_requires_gradient_sync
                     False), so FSDP2 keeps every layer's *unsharded* gradient, in fp32 (its reduce
                     dtype), across micro-batches. ACCUMULATION lists the alternatives modelled.
    optimizer        AdamW: 2 fp32 moments; Muon: 1 momentum for 2-D hidden matrices + AdamW for
                     the rest; Lion: 1 momentum. Plus the step's own temporaries (fused AdamW: none).
    activations      what the ops keep for backward (activations.py), with or without checkpointing
    loss             the fused output layer + loss: one chunk of logits, grad_h, grad_w (never B T V)
    temporaries      DDP's gradient buckets (a second copy of every gradient: groundup does not
                     set gradient_as_bucket_view); FSDP's all-gathered unsharded block (the current
                     one and the prefetched one), the root module's unsharded embedding and output
                     layer (kept through forward and backward), each block's unsharded gradient and
                     its fp32 reduce-scatter input; tensor parallelism's collective outputs.

Expert parallelism (`ep`): each GPU holds n_experts / ep of every MoE layer's expert stacks whole, with
their fp32 gradients and optimizer state, beside what DDP or FSDP holds of the rest (FSDP leaves the
experts out; DDP's buckets too). The all-to-all's row buffers live inside the MoE forward and backward,
not at the step's peak (the loss), so they are not counted.

Bytes are tensor bytes (what torch.cuda.max_memory_allocated counts); the CUDA context, NCCL's
buffers and allocator fragmentation are the headroom the plan keeps free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from groundup.model.config import ModelConfig
from groundup.plan.activations import (FP32, Layout, Numerics, block_backward_extra, block_saved, cpu_norm_extra,
                                       forward_extra, loss_bytes)
from groundup.plan.params import ParamSplit, param_split
from groundup.plan.pipeline_memory import pipeline_moments

# How FSDP accumulates gradients over the micro-batches of one optimizer step:
ACCUMULATION = {
    "unsharded-fp32": "distributed.fsdp_grad_sync = 'last': no reduce-scatter before the last micro-batch "
                      "(FSDP2 set_requires_gradient_sync(False)); every layer's unsharded gradient is kept in "
                      "the reduce dtype, fp32",
    "unsharded-compute": "the same in the dtype of the forward's weights (bf16 under bf16-weights): FSDP1's "
                         "no_sync, or FSDP2 with a bf16 reduce dtype",
    "sharded": "distributed.fsdp_grad_sync = 'every' (the default): reduce-scatter after every micro-batch; "
               "gradients stay sharded (more communication)",
}
PARTS = ("weights", "master_weights", "gradients", "optimizer", "activations", "loss", "temporaries")


@dataclass
class Setup:
    """One strategy on one GPU count, fully resolved."""

    model: ModelConfig
    batch: int  # sequences per micro-batch per data-parallel rank
    seq: int
    accum: int
    num: Numerics
    optimizer: str  # adamw, muon, lion
    optimizer_impl: str  # fused, foreach, loop
    checkpointing: bool
    strategy: str  # single, ddp, fsdp, hsdp, fsdp+tp
    gpus: int
    shard: int = 1  # ranks a parameter is sharded over (FSDP)
    tp: int = 1
    sequence_parallel: bool = False
    device: str = "cuda"
    fsdp_accumulate: str = "unsharded-fp32"  # see ACCUMULATION
    ep: int = 1  # expert parallelism: each GPU holds n_experts / ep of every MoE layer's experts, unsharded
    pp: int = 1  # pipeline stages (the blocks split over pp GPUs; FSDP over the gpus / pp of a stage)
    pp_schedule: str = "1f1b"  # 1f1b, interleaved_1f1b or gpipe
    pp_microbatches: int = 0  # pipeline micro-batches per micro-batch of `batch`; 0: pp
    pp_virtual: int = 0  # stages per GPU; 0: 2 with interleaved_1f1b, else 1


@dataclass
class Moment:
    name: str
    parts: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())


@dataclass
class Memory:
    peak: float  # bytes per GPU at the step's peak
    phase: str  # the moment of the peak
    parts: dict[str, float]  # the parts at that moment
    moments: list[Moment] = field(default_factory=list)


def optimizer_bytes(ps: ParamSplit, name: str, params: float) -> float:
    """State bytes for `params` parameters (fp32 states, as the master weights are fp32)."""
    if name == "lion":
        return params * FP32
    if name == "muon":  # momentum on 2-D hidden matrices, AdamW moments on the rest
        share = ps.muon_matrices() / ps.total
        return params * (share * FP32 + (1 - share) * 2 * FP32)
    return params * 2 * FP32


def optimizer_temporaries(ps: ParamSplit, s: Setup, params: float) -> float:
    if s.optimizer == "lion":
        return ps.largest * FP32  # m.lerp(grad) per parameter
    if s.optimizer == "muon":  # Nesterov update + Newton-Schulz iterates on the largest matrix
        return ps.largest * FP32 * 3
    if s.optimizer_impl == "foreach":  # whole-list intermediates (sqrt of the second moment, ...)
        return params * FP32
    if s.optimizer_impl == "loop":
        return ps.largest * FP32 * 2
    return 0.0  # fused AdamW updates in place


def step_memory(s: Setup) -> Memory:
    if s.pp > 1:  # pipeline stages: each rank's fullest moment (pipeline_memory.py), the largest is the peak
        ps = param_split(s.model)
        moments = [Moment(name, {**parts, "optimizer": optimizer_bytes(ps, s.optimizer, n)})
                   for name, n, parts in pipeline_moments(s)]
        top = max(moments, key=lambda m: m.total)
        return Memory(top.total, top.name, dict(top.parts), moments)
    cfg, num = s.model, s.num
    ps = param_split(cfg)
    lay = Layout(s.tp, s.sequence_parallel, s.device)
    B, T, L = s.batch, s.seq, cfg.n_layers
    N = B * T
    rows = N / s.tp if s.sequence_parallel else N

    # ---- parameters per GPU (tensor parallelism divides the matrices and the vocabulary)
    blocks = [(b["total"] - b["replicated"]) / s.tp + b["replicated"] for b in ps.blocks]
    out_layer = (ps.lm_head or ps.embed) / s.tp  # the weight the loss uses (tied: the embedding)
    root = ps.root - (ps.embed + ps.lm_head) * (1 - 1 / s.tp)
    fsdp = s.strategy in ("fsdp", "hsdp", "fsdp+tp")
    # expert parallelism: this GPU's experts, whole (FSDP and DDP leave them out), fp32 with their
    # gradients and optimizer state; under FSDP `blocks` is what FSDP shards
    xp = [b["experts"] / s.ep for b in ps.blocks] if s.ep > 1 else [0.0] * L
    if s.ep > 1:
        blocks = [n - b["experts"] + (0.0 if fsdp else x) for n, b, x in zip(blocks, ps.blocks, xp)]
    experts = sum(xp) if fsdp else 0.0
    total = sum(blocks) + root
    split = num.mode == "bf16-weights" and not fsdp  # a bf16 compute copy beside fp32 master weights
    w = num.weight  # bytes of the weights forward runs with

    # ---- activations along the step
    per_block = [block_saved(cfg, i, B, T, num, lay) for i in range(L)]
    saved = [sum(b.values()) for b in per_block]
    inputs = [b["block_input"] for b in per_block]
    fx = [forward_extra(cfg, B, T, num, lay) for _ in range(L)]
    bx = [block_backward_extra(cfg, i, B, T, num, lay) for i in range(L)]
    loss = loss_bytes(cfg, B, T, num, lay)
    final_keep = rows * cfg.d_model * num.stream + rows * FP32  # last block's output, kept by the final norm
    final_keep += sum(cpu_norm_extra(cfg, rows, num, lay, 1).values())
    kept = inputs if s.checkpointing else saved
    # autocast caches the bf16 copy of every weight it casts until the forward's autocast context
    # exits; without checkpointing those copies are the ones the linear layers save (counted there)
    cast_cache = sum(b["matmul"] for b in ps.blocks) / s.tp * 2 if num.autocast and s.checkpointing else 0.0
    if s.tp > 1:
        tp_buffers = 2 * N * cfg.d_model * num.compute  # all-reduce / all-gather outputs in flight
    else:
        tp_buffers = 0.0

    # ---- what is always there
    if fsdp:
        static = {"weights": total * FP32 / s.shard + experts * FP32, "master_weights": 0.0}
        opt_params = total / s.shard + experts
    else:
        static = {"weights": total * (2 if split else w), "master_weights": total * FP32 if split else 0.0}
        opt_params = total
    static["optimizer"] = optimizer_bytes(ps, s.optimizer, opt_params)
    buckets = (total - sum(xp)) * (2 if split else FP32) if s.strategy == "ddp" else 0.0
    grad_bytes = 2 if split else FP32  # the gradients backward produces for the stored weights

    moments: list[Moment] = []

    def add(name: str, grads: float, acts: float, loss_b: float = 0.0, temps: float = 0.0) -> None:
        moments.append(Moment(name, {**static, "gradients": grads, "activations": acts, "loss": loss_b,
                                     "temporaries": temps + buckets + tp_buffers}))

    # gradient bytes at a moment of micro-batch m: `done` = blocks whose backward finished
    later = s.accum > 1
    nosync = fsdp and later and s.fsdp_accumulate != "sharded"
    acc = FP32 if s.fsdp_accumulate == "unsharded-fp32" else w  # bytes of an accumulated unsharded gradient

    def grads(first: bool, last: bool, stage: str, done: tuple[int, ...] = ()) -> float:
        """Gradient bytes at a moment of a micro-batch; stage: forward, backward (blocks `done`
        finished), end (all of backward done) or step."""
        if stage == "forward":
            current = 0.0
        elif stage == "backward":
            current = sum(blocks[i] for i in done) + out_layer  # the output layer's comes first
        else:
            current = total
        root_now = 0.0 if stage == "forward" else (root if stage != "backward" else out_layer)
        if not fsdp:
            if stage == "step":
                return total * FP32  # split: master gradients; grads_to_master frees the bf16 ones
            if split and s.strategy == "single":  # one process moves them to fp32 after each micro-batch
                return (0.0 if first else total * FP32) + current * grad_bytes
            return (current if first else total) * grad_bytes
        sharded = total * FP32 / s.shard
        # expert parallelism's local experts: whole fp32 gradients from their block's backward on
        xg = (experts if stage != "backward" else sum(xp[i] for i in done)) if first else experts
        xg = 0.0 if stage == "forward" and first else xg * FP32
        if stage == "step":
            return sharded + xg
        blocks_done = current - root_now
        new_root = root_now * w + xg  # the root's unsharded gradient until its reduce-scatter at the end
        if not nosync:
            return (blocks_done * FP32 / s.shard if first else sharded) + new_root
        # no-sync accumulation: every block keeps its unsharded gradient until the last micro-batch
        if first:
            return blocks_done * acc + new_root
        if not last:
            return total * acc + new_root
        return (total - blocks_done) * acc + blocks_done * FP32 / s.shard + new_root

    def unsharded(i: int, backward: bool, first: bool = True, last: bool = True) -> float:
        if not fsdp:
            return 0.0
        in_flight = 2 if (backward or s.device == "cuda") else 1  # current + prefetched block
        nxt = blocks[max(i - 1, 0)] if backward else blocks[min(i + 1, L - 1)]
        params = root * w + blocks[i] * w + (nxt * w if in_flight == 2 else 0.0)
        if not backward:
            return params
        # this block's new unsharded gradient beside its fp32 reduce-scatter input (or the fp32 copy
        # it becomes for accumulation); a later no-sync micro-batch adds it into the accumulator in
        # place, and the last one reduce-scatters the accumulator after that
        if nosync and not first:
            return params + blocks[i] * (FP32 if last else w)
        return params + blocks[i] * (w + FP32)

    micro = [(True, not later)] + ([(False, True)] if later else [])
    if s.accum > 2 and nosync:
        micro.insert(1, (False, False))
    for first, last in micro:
        tag = "first" if first else ("last" if last else "middle")
        label = f" (micro-batch: {tag})" if later else ""
        # forward: block i runs with all earlier blocks' saved tensors (or inputs) kept
        for i in (L - 1,):
            acts = sum(kept[:i]) + (saved[i] if not s.checkpointing else inputs[i]) + fx[i] + cast_cache
            add(f"forward of block {i}{label}", grads(first, last, "forward"), acts, 0.0, unsharded(i, False))
        fsdp_root = root * w if fsdp else 0.0
        acts_end = sum(kept) + final_keep + cast_cache
        add(f"loss forward{label}", grads(first, last, "forward"), acts_end, loss.forward_peak, fsdp_root)
        # grad_h and grad_w scaled by the loss's gradient: the new grad_w becomes the output layer's
        # gradient (counted there) unless one from an earlier micro-batch is there to add it to
        grad_h = N * cfg.d_model * num.compute
        loss_b = loss.saved + (grad_h if first else loss.saved)
        add(f"loss backward{label}", grads(first, last, "backward"), acts_end - cast_cache, loss_b, fsdp_root)
        for i in range(L - 1, -1, -1):
            done = tuple(range(i + 1, L))
            if s.checkpointing:
                acts = sum(inputs[:i]) + saved[i] + max(bx[i], fx[i])
            else:
                acts = sum(saved[: i + 1]) + bx[i]
            add(f"backward of block {i}{label}", grads(first, last, "backward", done), acts, 0.0,
                unsharded(i, True, first, last))
        root_end = root * (w + FP32) if fsdp else 0.0  # root parameters and the fp32 reduce-scatter input
        add(f"backward end{label}", grads(first, last, "end"), 0.0, 0.0, root_end)
    opt_temps = optimizer_temporaries(ps, s, opt_params)
    if split:
        opt_temps += ps.largest * 2  # grads_to_master: one bf16 gradient beside the fp32 ones
    add("optimizer step", grads(False, True, "step"), 0.0, 0.0, opt_temps)

    top = max(moments, key=lambda m: m.total)
    return Memory(top.total, top.name, dict(top.parts), moments)
