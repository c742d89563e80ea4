"""Everything `groundup train` can be told, as one typed dataclass with a section per concern.

    cfg = load_config(TrainConfig, "configs/train-tiny.toml", ["train.max_steps=500", "optim.name=muon"])

The sections the training core reads (train, optim, schedule, precision, checkpoint, stability, eval,
log, distributed) are shared by every training verb; post-training configs compose them with their own
(posttrain/config.py), so a key that does not apply to a verb does not exist in its config.

Every default works for the `tiny` preset on a CPU. `train.max_steps` is the schedule's length: a
run of 5 steps is a cheap throughput probe, and the learning-rate schedule scales to any length.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from groundup.config import ConfigError, config_diff, fail, from_dict
from groundup.errors import CheckpointError
from groundup.model.config import ModelConfig


def _tiny() -> ModelConfig:
    return from_dict(ModelConfig, {"preset": "tiny"})


@dataclass
class StepsConfig:
    """The loop's knobs every training verb has."""

    max_steps: int = 200  # optimizer steps; the schedule's length
    grad_accum: int = 1  # micro-batches per optimizer step
    seed: int = 0  # model init, data order and dropout
    device: str = "auto"  # auto: cuda when available, else cpu
    # torch CPU threads; 0: leave torch's choice (set it for bit-exact reruns across machines); -1: measure
    # the fastest count at the start and every 10 s (a busy machine runs faster on fewer: train/threads.py)
    threads: int = 0
    compile: bool = False  # torch.compile the model (slow start, faster steps on GPU)
    grad_checkpointing: bool = False  # recompute block activations in backward (less memory)
    # Wall-clock budget in seconds for this invocation, setup included; 0 = none. max_steps is then a
    # first guess: after a few steady steps the run re-plans max_steps (and the eval and checkpoint
    # cadence, in proportion) to end on time, again while the schedule allows, and stops at the limit.
    time_limit_s: float = 0.0
    # A JSON file {"time_limit_s": ...} another process may rewrite to move that limit while the run
    # trains (the demo does, as the load changes); "" = none (train/time_budget.py)
    time_limit_file: str = ""
    # At start, continue from the run directory's newest intact checkpoint when it holds this verb's run
    # (a damaged one skipped), else start fresh; `groundup launch` sets it so a restarted attempt resumes
    auto_resume: bool = False
    # Seconds a process may go without finishing a step before it dumps every thread's stack to
    # RUN/hang-rank{R}.txt and exits non-zero, so the launcher restarts the group (train/hang.py); 0 = off
    hang_timeout_s: float = 0.0
    steps_from_epochs: ClassVar[bool] = False  # post-training: max_steps = 0 derives them from the epochs
    min_seq_len: ClassVar[int] = 1  # post-training: seq_len = 0 is the base model's context

    def validate(self) -> None:
        if not (self.time_limit_s >= 0 and math.isfinite(self.time_limit_s)):
            fail("time_limit_s", self.time_limit_s, "0 (no limit) or a positive number of seconds")
        if not (self.hang_timeout_s >= 0 and math.isfinite(self.hang_timeout_s)):
            fail("hang_timeout_s", self.hang_timeout_s, "0 (off) or a positive number of seconds")
        if self.time_limit_file and not self.time_limit_s:
            fail("time_limit_file", self.time_limit_file, "a file only with a time_limit_s for it to move")
        if self.max_steps < (0 if self.steps_from_epochs else 1):
            fail("max_steps", self.max_steps, "0 (derived from the epochs) or a positive step count"
                 if self.steps_from_epochs else "a positive integer")
        if self.grad_accum < 1:
            fail("grad_accum", self.grad_accum, "a positive integer")
        for key in ("batch_size", "seq_len"):
            if hasattr(self, key) and getattr(self, key) < (self.min_seq_len if key == "seq_len" else 1):
                fail(key, getattr(self, key), "0 (the base model's context) or a positive integer"
                     if key == "seq_len" and not self.min_seq_len else "a positive integer")
        if self.threads < -1:
            fail("threads", self.threads, "0 (torch's default), -1 (measured) or a positive count")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            fail("device", self.device, "auto, cpu, cuda or cuda:N")


@dataclass
class LoopConfig(StepsConfig):
    """The loop of a verb whose micro-batches are rows of a fixed length (all but GRPO)."""

    batch_size: int = 8  # sequences per micro-batch on each process
    seq_len: int = 256  # tokens per sequence (at most model.max_seq_len)


@dataclass
class DataConfig:
    shards: str = ""  # token-shard directory from `groundup data tokenize` (required)
    tokenizer: str = ""  # tokenizer directory; empty: the one the shards' index.json names
    domain_weights: dict[str, float] | None = None  # domain -> sampling weight; none: by token count
    bos_aligned: bool = False  # one document per row, led by begin-of-text (see tokens/loader.py)
    match_vocab: bool = True  # set model.vocab_size to the tokenizer's vocabulary size


@dataclass
class OptimConfig:
    name: Literal["adamw", "muon", "lion"] = "adamw"  # muon: Muon on hidden 2-D matrices, AdamW on the rest
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW (and Muon's AdamW part)
    eps: float = 1e-8  # AdamW denominator epsilon
    weight_decay: float = 0.1  # decoupled; Lion wants about 3-10x more (with 3-10x less lr)
    decay_embeddings: bool = False  # norms and biases are never decayed; embeddings only if true
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    implementation: Literal["auto", "fused", "foreach", "loop"] = "auto"  # AdamW kernel; auto: fused
    muon_momentum: float = 0.95  # Muon momentum coefficient
    muon_ns_steps: int = 5  # Newton-Schulz iterations
    lion_betas: list[float] = field(default_factory=lambda: [0.9, 0.99])  # Lion: update and momentum betas

    def validate(self) -> None:
        for key in ("betas", "lion_betas"):
            value = getattr(self, key)
            if len(value) != 2 or not all(0 <= b < 1 for b in value):
                fail(key, value, "two numbers in [0, 1)")
        for key in ("eps", "weight_decay", "grad_clip"):
            if getattr(self, key) < 0:
                fail(key, getattr(self, key), "a number >= 0")
        if not 0 <= self.muon_momentum < 1:
            fail("muon_momentum", self.muon_momentum, "a number in [0, 1)")
        if self.muon_ns_steps < 1:
            fail("muon_ns_steps", self.muon_ns_steps, "a positive integer")


@dataclass
class ScheduleConfig:
    # Defaults of a published 12B run: 2000 warmup steps to 3e-4, cosine to 3e-5.
    kind: Literal["cosine", "wsd", "constant"] = "cosine"  # learning-rate shape after warmup; wsd: warmup-stable-decay
    peak_lr: float = 3e-4  # learning rate reached at the end of warmup
    min_lr: float = 3e-5  # the floor cosine and WSD decay to
    warmup_steps: int = 2000  # optimizer steps of linear warmup to peak_lr (capped by warmup_max_fraction); 0 = none
    warmup_max_fraction: float = 0.1  # a short run warms up for at most this share of max_steps
    decay_fraction: float = 0.2  # WSD: the last share of steps that decays
    decay_shape: Literal["linear", "cosine", "sqrt"] = "sqrt"  # WSD decay; sqrt: 1 - sqrt(progress)

    def validate(self) -> None:
        if self.peak_lr <= 0:
            fail("peak_lr", self.peak_lr, "a positive number")
        if not 0 <= self.min_lr <= self.peak_lr:
            fail("min_lr", self.min_lr, f"a number in [0, peak_lr = {self.peak_lr}]")
        if self.warmup_steps < 0:
            fail("warmup_steps", self.warmup_steps, "an integer >= 0")
        for key in ("warmup_max_fraction", "decay_fraction"):
            if not 0 <= getattr(self, key) <= 1:
                fail(key, getattr(self, key), "a number in [0, 1]")


@dataclass
class PrecisionConfig:
    # auto: bf16-autocast on a GPU with bf16, fp32 elsewhere. bf16-weights: the model's weights
    # and activations in bf16 (no autocast copies), fp32 master weights held for the optimizer.
    mode: Literal["auto", "fp32", "bf16-autocast", "bf16-weights"] = "auto"
    # How bf16 matmuls run on a CPU without native bf16 (no AVX-512-BF16/AMX): "native" calls
    # torch's bf16 kernel; "fp32" multiplies the bf16 values in fp32 and rounds the result to
    # bf16, which is what bf16 hardware computes (fp32 accumulation) and much faster there.
    cpu_bf16_matmul: Literal["auto", "native", "fp32"] = "auto"


@dataclass
class CheckpointConfig:
    every: int = 100  # steps between checkpoints; the final step is always saved
    keep_last: int = 5  # recent checkpoints kept
    keep_every: int = 10  # also keep every 10th checkpoint (step a multiple of every * keep_every); 0 = none
    # Sharded runs (FSDP2, tensor parallel): write the shards in the background from a CPU copy
    # while training continues; `latest` moves only once every shard and meta.json are written.
    # Single-process and DDP runs always save synchronously.
    async_save: bool = False

    def validate(self) -> None:
        if self.every < 1:
            fail("every", self.every, "a positive integer")
        if self.keep_last < 1:
            fail("keep_last", self.keep_last, "a positive integer (the latest checkpoint is always kept)")
        if self.keep_every < 0:
            fail("keep_every", self.keep_every, "an integer >= 0")


@dataclass
class StabilityConfig:
    """The spike guard and rollback, on every training verb."""

    spike_factor: float = 5.0  # skip a step whose grad norm exceeds this x the running median; 0 = off
    spike_window: int = 100  # accepted steps the median is taken over
    spike_min_history: int = 10  # judge spikes only once this many steps were accepted
    rollback_after: int = 5  # consecutive skipped steps that trigger a rollback; 0 = never
    rollback_lr_factor: float = 0.5  # learning rate multiplier applied at each rollback
    max_rollbacks: int = 5  # after this many rollbacks the run stops with a message (it is diverging)

    def validate(self) -> None:
        if self.spike_factor < 0 or 0 < self.spike_factor <= 1:
            fail("spike_factor", self.spike_factor, "0 (off) or a number > 1")
        for key in ("spike_window", "spike_min_history"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "a positive integer")
        if self.rollback_after < 0:
            fail("rollback_after", self.rollback_after, "an integer >= 0")
        if not 0 < self.rollback_lr_factor <= 1:
            fail("rollback_lr_factor", self.rollback_lr_factor, "a number in (0, 1]")
        if self.max_rollbacks < 1:
            fail("max_rollbacks", self.max_rollbacks, "a positive integer")


@dataclass
class PretrainStabilityConfig(StabilityConfig):
    """Pretraining's guards, plus the data gate on repeated n-grams (stability.gate_batch)."""

    repeat_ngram: int = 13  # data gate: n-gram length (tokens)
    max_repeat_fraction: float = 0.15  # drop a sequence whose repeated n-grams exceed this share; 1 = off

    def validate(self) -> None:
        super().validate()
        if self.repeat_ngram < 1:
            fail("repeat_ngram", self.repeat_ngram, "a positive integer")
        if not 0 < self.max_repeat_fraction <= 1:
            fail("max_repeat_fraction", self.max_repeat_fraction, "a number in (0, 1]")


@dataclass
class EvalConfig:
    """When the objective's evaluation runs (every training verb)."""

    every: int = 100  # steps between evaluations; 0 = none during the run (at_end decides the last)
    at_end: bool = True  # also evaluate after the last step (or when train.time_limit_s ends the run)


@dataclass
class ValidationConfig(EvalConfig):
    """Pretraining's validation pass over the shards' val split."""

    max_batches: int = 20  # per domain; 0 = the whole validation split
    batch_size: int = 0  # 0: train.batch_size


@dataclass
class LogConfig:
    every: int = 10  # steps between metrics.jsonl lines (and progress-bar updates)
    progress: bool = True  # progress bars on the terminal; --quiet sets it false
    peak_flops: float = 0.0  # per process, for MFU; 0: the GPU table, or a quiet calibration cached (train/peak.py)
    tensorboard: bool = False  # write RUN/tensorboard (needs the tensorboard package)
    wandb: bool = False  # log to Weights & Biases (needs wandb and a login)
    wandb_project: str = "groundup"  # Weights & Biases project the run logs to

    def validate(self) -> None:
        if not (self.peak_flops >= 0 and math.isfinite(self.peak_flops)):
            fail("peak_flops", self.peak_flops, "0 (the GPU table or a calibration) or a positive FLOP/s, e.g. 1e14")


@dataclass
class DistributedConfig:
    # Chosen when launched by torchrun with more than one process; one process ignores it, except that
    # fsdp under torchrun with one process shards over a one-process mesh (the sharded path on one GPU).
    # ddp: a full model copy per process; fsdp: sharded (FSDP2); hsdp: FSDP2 hybrid, sharded within a
    # replica group and replicated across them (train/mesh.py)
    strategy: Literal["ddp", "fsdp", "hsdp"] = "ddp"
    replicas: int = 0  # hsdp: replica groups (each shards over processes / replicas); 0: one per node
    backend: Literal["auto", "nccl", "gloo"] = "auto"  # auto: nccl on GPUs, gloo on CPUs
    meta_init: bool = False  # FSDP: build on the meta device and initialise shards in place (big models)
    # FSDP with gradient accumulation: "every" reduce-scatters after each micro-batch, so gradients
    # stay sharded (a 12B model's unsharded fp32 gradients are 48 GB per GPU); "last" waits for the
    # last micro-batch (less communication, every layer's full gradient held in the meantime).
    fsdp_grad_sync: Literal["every", "last"] = "every"
    # Tensor parallelism: attention heads and MLP width split over `tp` processes (consecutive ranks,
    # so keep it within a node); the processes / tp data-parallel groups shard with FSDP2 on a
    # (dp, tp) mesh. 1 = off. Needs strategy "fsdp" and tp dividing the world size and the heads.
    tp: int = 1
    sequence_parallel: bool = False  # with tp > 1: norms and residuals split by sequence (less memory)
    # Seconds a collective may wait for the other processes before it fails and ends the attempt (a dead
    # or stuck peer), so a launcher restarts it instead of hanging; the process group's timeout
    timeout_s: float = 600.0
    # Expert parallelism: each MoE layer's experts split over `ep` consecutive processes, tokens sent to
    # their experts by all-to-all (train/expert_parallel.py). 1 = off. Must divide the processes and
    # model.n_experts; data parallelism (ddp or fsdp) stays over every process.
    ep: int = 1
    # Pipeline parallelism (train/pipeline.py): the blocks split into `pp` stages on consecutive groups of
    # processes, each stage tensor-parallel over tp (if > 1), then FSDP2 (or HSDP) over the processes /
    # (pp x tp) of a stage; 1 = off. Needs strategy fsdp or hsdp.
    pp: int = 1
    pp_schedule: Literal["1f1b", "interleaved_1f1b", "gpipe"] = "1f1b"  # gpipe: every forward, then every backward
    pp_microbatches: int = 0  # pipeline micro-batches per loader batch (train.batch_size splits); 0: pp
    pp_virtual_stages: int = 0  # stages per process; 0: 2 with interleaved_1f1b, else 1

    def validate(self) -> None:
        pipeline_problem = _pipeline_problem(self)
        if pipeline_problem:
            fail(*pipeline_problem)
        if self.tp < 1:
            fail("tp", self.tp, "a positive integer (1 = no tensor parallelism)")
        if self.tp > 1 and self.strategy == "ddp":
            fail("tp", self.tp, "1 unless distributed.strategy = 'fsdp' (tensor parallelism composes with "
                 "FSDP2; with one data-parallel group FSDP only adds its wrapper)")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            fail("timeout_s", self.timeout_s, "a positive number of seconds")
        if self.sequence_parallel and self.tp == 1:
            fail("sequence_parallel", True, "false unless distributed.tp > 1")
        if self.ep < 1:
            fail("ep", self.ep, "a positive integer (1 = no expert parallelism)")
        if self.ep > 1 and self.tp > 1:
            fail("ep", self.ep, "1 when distributed.tp > 1 (tensor parallelism does not shard MoE layers)")
        if self.ep > 1 and self.strategy == "hsdp":
            fail("ep", self.ep, "1 with strategy 'hsdp' (expert parallelism composes with 'ddp' and 'fsdp')")
        if self.ep > 1 and self.meta_init:
            fail("ep", self.ep, "1 with distributed.meta_init (build the model whole, then shard the experts)")


def _pipeline_problem(c: DistributedConfig) -> tuple | None:
    """(key, value, expected) for the first bad pipeline or HSDP setting, or None."""
    if c.replicas < 0 or (c.replicas and c.strategy != "hsdp"):
        return "replicas", c.replicas, "0 (one per node) or a positive count, and only with strategy 'hsdp'"
    if c.pp < 1:
        return "pp", c.pp, "a positive integer (1 = no pipeline parallelism)"
    if c.pp > 1 and c.strategy == "ddp":
        return "pp", c.pp, ("1 unless distributed.strategy is 'fsdp' or 'hsdp' (each stage shards over its "
                            "data-parallel group)")
    if c.pp > 1 and c.ep > 1:
        return "pp", c.pp, "1 when distributed.ep > 1 (pipeline stages are not expert-parallel here)"
    if c.pp_microbatches < 0:
        return "pp_microbatches", c.pp_microbatches, "0 (= distributed.pp) or a positive count"
    if c.pp > 1 and c.pp_schedule != "gpipe" and 0 < c.pp_microbatches < c.pp:
        return "pp_microbatches", c.pp_microbatches, f">= distributed.pp ({c.pp}) for a 1F1B schedule"
    interleaved = c.pp_schedule == "interleaved_1f1b"
    v = c.pp_virtual_stages
    if v < 0 or (v == 1 and interleaved) or (v > 1 and not interleaved):
        return "pp_virtual_stages", c.pp_virtual_stages, ("0 or >= 2 with pp_schedule 'interleaved_1f1b'" if interleaved
                                                          else "0 or 1 unless pp_schedule = 'interleaved_1f1b'")
    return None


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=_tiny)
    data: DataConfig = field(default_factory=DataConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    stability: PretrainStabilityConfig = field(default_factory=PretrainStabilityConfig)
    eval: ValidationConfig = field(default_factory=ValidationConfig)
    log: LogConfig = field(default_factory=LogConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    verb: ClassVar[str] = "train"
    # A [model] table starts from the default model (tiny), as every section starts from its
    # default (groundup.config.from_dict): `model.n_layers=4` means "tiny with 4 layers".

    def validate(self) -> None:
        if self.train.seq_len > self.model.max_seq_len:
            raise ConfigError(f"train.seq_len = {self.train.seq_len}: expected at most model.max_seq_len "
                              f"({self.model.max_seq_len})", key="train.seq_len")


# Keys whose change makes a checkpoint meaningless for this run: resuming with any other change
# (max_steps, lr, checkpoint/eval/log cadence, precision, strategy, batch split) is allowed and logged.
# Moved shard or tokenizer directories are fine: the tokenizer hash and the loader state check the data.
INCOMPATIBLE = ("model.", "data.bos_aligned", "data.domain_weights", "optim.name", "train.seq_len", "train.seed")


def resume_differences(saved, new) -> tuple[list[str], list[str]]:
    """(incompatible, allowed) differences between a run's saved config and the one resuming it.

    A config class may widen the incompatible keys with an `incompatible_keys` class attribute."""
    diff = config_diff(saved, new)
    keys = tuple(getattr(type(new), "incompatible_keys", INCOMPATIBLE))
    bad = [d for d in diff if d.startswith(keys)]
    return bad, [d for d in diff if d not in bad]


def check_compatible(saved, new, where: str) -> None:
    """Refuse to continue `saved`'s run with `new` when they differ in a key that matters."""
    bad, _ = resume_differences(saved, new)
    if bad:
        raise CheckpointError(f"{where} was written with an incompatible config; these keys differ (saved -> "
                              f"now): {'; '.join(bad)}. Start a new run (--out) to change them")
