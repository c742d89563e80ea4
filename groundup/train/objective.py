"""What a training step optimizes: an objective turns a micro-batch into a loss and named metrics.

The training core (state.py, step.py, loop.py) knows nothing about next-token prediction, chats or
preferences; it asks the objective four things and gives every objective the same machinery (exact
resume, checkpoints, bf16, gradient accumulation, clipping, the spike guard and rollback,
evaluation, logging, DDP and FSDP2):

    units(batch) -> int         what the loss averages over in this micro-batch: valid targets for a
                                language-model loss, pairs for DPO, sequences for a reward model
    objective(model, batch, device) -> ObjectiveOutput(loss, metrics)
                                loss: the mean over the micro-batch's units, to backpropagate;
                                metrics: name -> mean over the same units, "loss" first (the value the
                                spike guard judges). The step weights every metric by its micro-batch's
                                units, sums over micro-batches and processes, and divides by the total,
                                so a logged value is the mean over the step's units however the step is
                                split between micro-batches and processes.
    gate(batch) -> (batch, dropped rows)          optional data gate (pretraining's repeated n-grams)
    evaluate(state) -> (record, message) | None   optional validation pass, logged to metrics.jsonl

A batch is whatever the loader yields; `tokens(batch)` (default: the size of `batch.inputs`) counts
what it costs for throughput and MFU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from groundup.eval.perplexity import evaluate
from groundup.tokens.loader import IGNORE_INDEX
from groundup.train.stability import gate_batch

if TYPE_CHECKING:
    from groundup.train.state import TrainState


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor  # mean over the micro-batch's units; what backward() runs on
    metrics: dict[str, torch.Tensor | float]  # name -> mean over the same units, "loss" first


class Objective(Protocol):
    name: str

    def units(self, batch: Any) -> int: ...

    def __call__(self, model: torch.nn.Module, batch: Any, device: torch.device) -> ObjectiveOutput: ...


def batch_tokens(objective: Any, batch: Any) -> int:
    """Tokens a micro-batch costs: the objective's own count, else the size of `batch.inputs`."""
    count = getattr(objective, "tokens", None)
    return int(count(batch)) if count is not None else int(batch.inputs.numel())


class NextTokenObjective:
    """Pretraining: mean cross-entropy of each next token (plus z-loss and MoE balancing), the
    model's fused chunked loss; validation is loss and bits per byte per domain of the shards."""

    name = "next_token"

    def __init__(self, cfg):
        self.cfg = cfg  # a TrainConfig: stability (the gate), data and eval (validation)

    def units(self, batch) -> int:
        return int((batch.targets != IGNORE_INDEX).sum())

    def gate(self, batch):
        return gate_batch(batch, self.cfg.stability)

    def __call__(self, model, batch, device) -> ObjectiveOutput:
        out = model(batch.inputs.to(device, non_blocking=True), batch.targets.to(device, non_blocking=True))
        return ObjectiveOutput(out.loss, {"loss": out.ce_loss, "z_loss": out.z_loss})

    def evaluate(self, state: "TrainState") -> tuple[dict, str]:
        cfg, d = self.cfg, state.dist
        result = evaluate(state.model, cfg.data.shards, "val", seq_len=cfg.train.seq_len,
                          batch_size=cfg.eval.batch_size or cfg.train.batch_size,
                          max_batches=cfg.eval.max_batches or None, tokenizer=state.tokenizer, rank=d.rank,
                          world_size=d.world_size, reduce=d.sum, context=state.precision.context,
                          bos_aligned=cfg.data.bos_aligned)
        record = {"step": state.step, "tokens": state.tokens, "val_loss": result["loss"], "val_bpb": result["bpb"],
                  **{f"val_bpb/{name}": r["bpb"] for name, r in result["domains"].items()}}
        message = (f"step {state.step}: val loss {result['loss']:.4f}, bpb {result['bpb']:.4f} ("
                   + ", ".join(f"{n} {r['bpb']:.3f}" for n, r in result["domains"].items()) + ")")
        return record, message
