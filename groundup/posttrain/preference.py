"""DPO and KTO as objectives on the training core, with TRL's definitions.

DPO (Rafailov et al. 2023), for a pair with policy/reference log-likelihoods of the completions and
Δ = (log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l)):
    sigmoid   -(1 - ε) log σ(β Δ) - ε log σ(-β Δ)        (ε = label smoothing, conservative DPO; ε = 0 is TRL's)
    ipo       (Δ' - 1 / (2β))², Δ' the same with each log-ratio divided by its completion's length (TRL)
    hinge     max(0, 1 - β Δ)
plus, with `sft_weight` w > 0 (RPO; TRL's loss_type [loss, "sft"]), w times the negative mean
log-probability of the batch's chosen completion tokens.
KTO (Ethayarajh et al. 2024; TRL): z = max(0, mean over the batch of log π(y'|x) - log π_ref(y'|x)) on
mismatched pairs (each prompt with another example's completion), detached;
    desirable   λ_D (1 - σ(β (r - z))),   undesirable   λ_U (1 - σ(β (z - r))),   r = log π(y|x) - log π_ref(y|x)
The reference log-likelihoods come from the model before training (the base with the adapter still
zero under LoRA, so there is no second copy of the model), computed once and cached with the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from groundup.errors import CheckpointError, DataError
from groundup.model.logprobs import logprobs
from groundup.model.loss import IGNORE_INDEX
from groundup.rewards.model_scorer import full_rows
from groundup.train.objective import ObjectiveOutput


def completion_rows(seqs: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of prompt + completion rows, right-padded; only completion tokens are targets."""
    T = max(len(p) + len(c) for p, c in seqs) - 1
    x = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    t = torch.full((len(seqs), T), IGNORE_INDEX, dtype=torch.long)
    for i, (p, c) in enumerate(seqs):
        row = torch.tensor(p + c, dtype=torch.long)
        x[i, : len(row) - 1] = row[:-1]
        t[i, len(p) - 1 : len(row) - 1] = row[len(p):]
    return x, t


def sequence_logps(model, inputs: torch.Tensor, targets: torch.Tensor, device) -> torch.Tensor:
    """Sum of each row's completion log-probabilities (the shared scorer, inside the model's forward)."""
    return logprobs(model, inputs.to(device), targets.to(device)).sum(-1)


class PrefBatch(NamedTuple):
    inputs: torch.Tensor  # DPO: chosen rows then rejected rows; KTO: completions then mismatched completions
    targets: torch.Tensor
    index: torch.Tensor  # (B,) item numbers, for the cached reference log-likelihoods
    extra: torch.Tensor  # DPO: (B, 2) completion lengths; KTO: (B,) labels (1 = desirable)


class PreferenceLoader:
    """Shuffled epochs over pairs (DPO) or feedback (KTO) with exact resume (epoch, position)."""

    def __init__(self, items: list, kind: str, batch_size: int, pad_id: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1):
        if not items:
            raise DataError(f"no usable {kind} examples (see the skipped records above)")
        self.items, self.kind, self.batch_size, self.pad_id = items, kind, batch_size, pad_id
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.position = 0, 0

    def _order(self) -> np.ndarray:
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.items))
        return perm[self.rank :: self.world_size] if len(perm) >= self.world_size else perm

    def __iter__(self):
        return self

    def __next__(self) -> PrefBatch:
        picked, order = [], self._order()
        while len(picked) < self.batch_size:
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            picked.append(self.items[order[self.position]])
            self.position += 1
        return make_batch(picked, self.kind, self.pad_id, self.items)

    def state_dict(self) -> dict:
        return {"version": 1, "epoch": self.epoch, "position": self.position, "items": len(self.items),
                "seed": self.seed, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        for key, value in (("items", len(self.items)), ("seed", self.seed), ("batch_size", self.batch_size)):
            if state.get(key) != value:
                raise CheckpointError(f"cannot resume the {self.kind} data: {key} is {value}, the checkpoint's "
                                      f"{state.get(key)} (the data files or the batch size changed)")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def kl_partner(items: list, i: int, chunk: int) -> int:
    """The example whose completion KTO pairs with example i's prompt: the previous one within fixed
    chunks of the data (TRL's rotation by one within each batch-sized chunk of the dataset)."""
    start = (i // chunk) * chunk
    end = min(start + chunk, len(items))
    return end - 1 if i == start else i - 1


def make_batch(items: list, kind: str, pad_id: int, all_items: list, chunk: int | None = None) -> PrefBatch:
    """A batch of pairs ("dpo"; "rm": whole rows for a reward model) or feedback ("kto")."""
    index = torch.tensor([x.index for x in items])
    if kind == "rm":
        inputs, last = full_rows([x.prompt + x.chosen for x in items] + [x.prompt + x.rejected for x in items], pad_id)
        targets = torch.full_like(inputs, IGNORE_INDEX)  # the chosen completions' next tokens (a reward
        for i, x in enumerate(items):                    # model's optional language-modelling term)
            end = len(x.prompt) + len(x.chosen) - 1
            targets[i, len(x.prompt) - 1 : end] = inputs[i, len(x.prompt) : end + 1]
        return PrefBatch(inputs, targets, index, last)
    if kind == "dpo":
        seqs = [(x.prompt, x.chosen) for x in items] + [(x.prompt, x.rejected) for x in items]
        extra = torch.tensor([[len(x.chosen), len(x.rejected)] for x in items], dtype=torch.float32)
    else:
        chunk = chunk or len(items)
        partners = [all_items[kl_partner(all_items, x.index, chunk)] for x in items]
        seqs = [(x.prompt, x.completion) for x in items] + [(x.prompt, p.completion) for x, p in zip(items, partners)]
        extra = torch.tensor([float(x.label) for x in items])
    inputs, targets = completion_rows(seqs, pad_id)
    return PrefBatch(inputs, targets, index, extra)


@torch.no_grad()
def reference_logps(model, items: list, kind: str, pad_id: int, device, batch_size: int = 8,
                    chunk: int = 8) -> torch.Tensor:
    """(N, 2) log-likelihoods under the model as it is now: DPO (chosen, rejected); KTO (matched, mismatched)."""
    was = model.training
    model.eval()
    out = torch.zeros(len(items), 2)
    for i in range(0, len(items), batch_size):
        part = items[i : i + batch_size]
        b = make_batch(part, kind, pad_id, items, chunk)
        lp = sequence_logps(model, b.inputs, b.targets, device).float().cpu()
        out[b.index] = torch.stack([lp[: len(part)], lp[len(part):]], dim=1)
    model.train(was)
    return out


def dpo_loss(chosen_logratio: torch.Tensor, rejected_logratio: torch.Tensor, lengths: torch.Tensor, loss: str,
             beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-pair DPO loss (see the module docstring); `lengths` (B, 2) completion token counts."""
    delta = chosen_logratio - rejected_logratio
    if loss == "sigmoid":
        return -(1 - label_smoothing) * F.logsigmoid(beta * delta) - label_smoothing * F.logsigmoid(-beta * delta)
    if loss == "ipo":
        avg = chosen_logratio / lengths[:, 0].clamp_min(1) - rejected_logratio / lengths[:, 1].clamp_min(1)
        return (avg - 1 / (2 * beta)) ** 2
    if loss == "hinge":
        return torch.relu(1 - beta * delta)
    raise ValueError(f"unknown DPO loss {loss!r}")


def kto_loss(logratio: torch.Tensor, kl: torch.Tensor, labels: torch.Tensor, beta: float, desirable_weight: float,
             undesirable_weight: float) -> torch.Tensor:
    """Per-example KTO loss; `kl` is the detached, clamped reference point z."""
    desirable = desirable_weight * (1 - torch.sigmoid(beta * (logratio - kl)))
    undesirable = undesirable_weight * (1 - torch.sigmoid(beta * (kl - logratio)))
    return torch.where(labels.bool(), desirable, undesirable)


@dataclass
class PreferenceObjective:
    """DPO (kind "dpo") or KTO (kind "kto") on batches of a PreferenceLoader."""

    kind: str
    cfg: object  # the stage's section: beta, loss, label_smoothing, desirable_weight, undesirable_weight
    reference: torch.Tensor  # (N, 2) training items' reference log-likelihoods
    heldout: list | None = None
    heldout_reference: torch.Tensor | None = None
    pad_id: int = 0

    @property
    def name(self) -> str:
        return self.kind

    def units(self, batch: PrefBatch) -> int:
        return len(batch.index)

    def __call__(self, model, batch: PrefBatch, device) -> ObjectiveOutput:
        return self.compute(model, batch, device, self.reference)

    def compute(self, model, batch: PrefBatch, device, reference: torch.Tensor) -> ObjectiveOutput:
        B, c = len(batch.index), self.cfg
        ref = reference[batch.index].to(device)
        if self.kind == "dpo":
            lp = sequence_logps(model, batch.inputs, batch.targets, device)
            chosen, rejected = lp[:B] - ref[:, 0], lp[B:] - ref[:, 1]
            lengths = batch.extra.to(device)
            per = dpo_loss(chosen, rejected, lengths, c.loss, c.beta, c.label_smoothing)
            loss = per.mean()
            nll = -lp[:B].sum() / lengths[:, 0].sum().clamp_min(1)  # per chosen token, over the batch (TRL)
            if c.sft_weight:
                loss = loss + c.sft_weight * nll
            rc, rr = c.beta * chosen.detach(), c.beta * rejected.detach()
            return ObjectiveOutput(loss, {"loss": loss.detach(), "rewards_chosen": rc.mean(),
                                          "rewards_rejected": rr.mean(), "margin": (rc - rr).mean(),
                                          "accuracy": (rc > rr).float().mean(), "chosen_nll": nll.detach()})
        lp = sequence_logps(model, batch.inputs[:B], batch.targets[:B], device)
        with torch.no_grad():  # the reference point is a detached estimate (TRL)
            kl_lp = sequence_logps(model, batch.inputs[B:], batch.targets[B:], device)
            kl = (kl_lp - ref[:, 1]).mean().clamp_min(0)
        logratio = lp - ref[:, 0]
        labels = batch.extra.to(device)
        per = kto_loss(logratio, kl, labels, c.beta, c.desirable_weight, c.undesirable_weight)
        rewards = c.beta * logratio.detach()
        return ObjectiveOutput(per.mean(), {"loss": per.mean().detach(), "kl": kl, "rewards": rewards.mean(),
                                            "desirable_share": labels.mean()})

    @torch.no_grad()
    def evaluate(self, state) -> tuple[dict, str]:
        record = {"step": state.step, "tokens": state.tokens}
        if not self.heldout:
            return record, f"step {state.step}: no held-out data"
        model, device = state.model, state.dist.device
        was = model.training
        model.eval()
        sums = {}
        for i in range(0, len(self.heldout), 8):
            part = self.heldout[i : i + 8]
            batch = make_batch(part, self.kind, self.pad_id, self.heldout)
            with state.precision.context():
                out = self.compute(model, batch._replace(index=torch.tensor([x.index for x in part])), device,
                                   self.heldout_reference)
            for k, v in out.metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) * len(part)
        model.train(was)
        record.update({f"val_{k}": v / len(self.heldout) for k, v in sums.items()})
        shown = "accuracy" if self.kind == "dpo" else "loss"
        return record, f"step {state.step}: held-out {shown} {record['val_' + shown]:.4f}"
