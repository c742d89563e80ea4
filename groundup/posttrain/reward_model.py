"""`rm(cfg, out)`: a reward model (the transformer with a scalar value head) trained on preference
pairs with the Bradley-Terry loss, and its use as a reward (GRPO, best-of-n sampling).

    loss = -log σ(r(x, y_w) - r(x, y_l))       r: the value head on the completion's last token
           + lm_weight x NLL(y_w | x) per token  (optional: a language-modelling term on the chosen
                                                  completions, through the same trunk)
    accuracy = share of pairs with r(x, y_w) > r(x, y_l)   (logged per step; held-out at evaluation)

The model starts from `cfg.base` (an SFT model, usually) with a freshly initialised head; its
checkpoints are ordinary model directories whose config has `value_head = true`.
groundup/rewards/model_scorer.py scores (prompt, completion) texts with it, rendered as a chat turn;
the reward name `rm:PATH` uses it wherever rewards are accepted. `rm --process` trains a process
reward model instead, on the same head and core (posttrain/prm.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from groundup.errors import DataError
from groundup.io import atomic_write_json
from groundup.layout import DATA_REPORT_FILE
from groundup.model.heads import RewardScore
from groundup.model.loss import IGNORE_INDEX
from groundup.model.transformer import Transformer
from groundup.posttrain.config import RMConfig
from groundup.posttrain.pairs import read_pairs, split_heldout
from groundup.posttrain.records import no_usable_held_out
from groundup.posttrain.preference import PrefBatch, PreferenceLoader, make_batch
from groundup.train.objective import ObjectiveOutput
from groundup.train.session import open_run


def pair_rewards(model, batch: PrefBatch, device, with_nll: bool = False):
    """(rewards of the chosen completions, of the rejected) for a "rm" batch: chosen rows then rejected rows,
    each read at its last token; `with_nll`: and the chosen completions' mean negative log-likelihood per
    token, from the same pass."""
    B = len(batch.index)
    targets = batch.targets.to(device) if with_nll else None
    out = model(batch.inputs.to(device), targets, RewardScore(batch.extra.to(device)))
    r = out.rewards
    if not with_nll:
        return r[:B], r[B:]
    mask = (targets != IGNORE_INDEX).float()
    return r[:B], r[B:], -(out.logprobs.float() * mask).sum() / mask.sum().clamp_min(1)


class RewardObjective:
    """-log σ(r_chosen - r_rejected), plus `lm_weight` x the chosen completions' NLL per token."""

    name = "rm"

    def __init__(self, heldout: list, pad_id: int, lm_weight: float = 0.0):
        self.heldout, self.pad_id, self.lm_weight = heldout, pad_id, lm_weight

    def units(self, batch: PrefBatch) -> int:
        return len(batch.index)

    def __call__(self, model, batch: PrefBatch, device) -> ObjectiveOutput:
        chosen, rejected, *nll = pair_rewards(model, batch, device, with_nll=bool(self.lm_weight))
        loss = -F.logsigmoid(chosen - rejected).mean()
        metrics = {"loss": loss.detach(), "accuracy": (chosen > rejected).float().mean(),
                   "margin": (chosen - rejected).mean().detach()}
        if nll:
            metrics["bt_loss"], metrics["chosen_nll"] = loss.detach(), nll[0].detach()
            loss = loss + self.lm_weight * nll[0]
            metrics["loss"] = loss.detach()
        return ObjectiveOutput(loss, metrics)

    @torch.no_grad()
    def evaluate(self, state) -> tuple[dict, str]:
        record = {"step": state.step, "tokens": state.tokens}
        if not self.heldout:
            return record, f"step {state.step}: no held-out pairs"
        model = state.model
        was = model.training
        model.eval()
        right = 0
        for i in range(0, len(self.heldout), 16):
            with state.precision.context():
                c, r = pair_rewards(model, make_batch(self.heldout[i : i + 16], "rm", self.pad_id, self.heldout),
                                    state.dist.device)
            right += int((c > r).sum())
        model.train(was)
        record["val_accuracy"] = right / len(self.heldout)
        return record, f"step {state.step}: held-out pair accuracy {record['val_accuracy']:.3f}"


def with_value_head(run) -> Transformer:
    """The run's base model with a freshly initialised value head (its weights drawn from train.seed): where
    an outcome and a process reward model start."""
    torch.manual_seed(run.cfg.train.seed)
    model = Transformer(dataclasses.replace(run.model.cfg, value_head=True))
    missing, unexpected = model.load_state_dict(run.model.state_dict(), strict=False)
    if unexpected or any(not k.startswith("value_head.") for k in missing):  # a base with a head already
        raise DataError(f"{run.cfg.base}: cannot start a reward model from it (unexpected {unexpected[:2]}, "
                        f"missing {missing[:2]})")
    return model


def rm(cfg: RMConfig, out_dir: str | Path, resume: bool = False) -> dict:
    """Train a reward model from `cfg.base` on `cfg.rm.data` pairs; returns the summary."""
    section = cfg.rm
    with open_run(cfg, out_dir, resume, base=cfg.base) as run:
        cfg, d, tok, note = run.cfg, run.dist, run.tokenizer, run.note
        if not section.data:
            raise DataError("no preference pairs: pass --data FILE... (prompt, chosen, rejected)")
        items, report = read_pairs(section.data, tok, cfg.train.seq_len + 1)
        if section.eval_data:
            held, held_report = read_pairs(section.eval_data, tok, cfg.train.seq_len + 1)
            if not held:  # never "no held-out pairs" for files the user named
                raise no_usable_held_out("--eval-data", section.eval_data, "preference pair",
                                         f"{held_report.records:,} read", held_report.skipped[:2])
            train = items
        else:
            train, held = split_heldout(items, section.val_fraction, section.seed)
        for group in (train, held):
            for i, x in enumerate(group):
                x.index = i
        pad = tok.pad_id if tok.pad_id is not None else tok.eot_id
        loader = PreferenceLoader(train, "rm", cfg.train.batch_size, pad, seed=section.seed, rank=d.rank,
                                  world_size=d.world_size)
        run.steps_from_epochs(section.epochs, len(train), cfg.train.batch_size)
        run.commit()
        cfg = run.cfg
        model = with_value_head(run)
        note(f"{len(train):,} pairs ({len(held):,} held out), {len(report.skipped):,} skipped, "
             f"{cfg.train.max_steps:,} steps")
        if d.is_main and not resume:
            atomic_write_json(run.out / DATA_REPORT_FILE, {**report.to_dict(), "train": len(train), "heldout": len(held)})
        return run.train(RewardObjective(held, pad, section.lm_weight), loader, model=model)
