"""`process_rm(cfg, out)`: a process reward model (`groundup rm --process`), the outcome reward model's
transformer and value head scored at the end of every step of a solution, on the same training core.

    loss = mean over the batch's steps of BCE(σ(v(x, s_1..s_i)), label_i)       v: the value head at step i's
         + lm_weight x NLL(solution | prompt) per token (optional, as rm's)      last token; label in [0, 1]

Only the step ends are scored: no other position of a row reaches the loss. The labels come from
Math-Shepherd's automatic labelling of the policy's own solutions (prm_labels.py), written to
RUN/step_labels.jsonl chunk by chunk before the first step, so a run stopped while labelling
continues there (`--resume`); or from records already labelled (`prompt`, `steps`, `labels`) in
rm.data. RUN/process_reward.json records the step split, which `prm:PATH` (rewards/process_scorer.py)
reads to score a solution as training read it: a solution's score is its lowest step's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from groundup.data.readers import ReadStats, iter_records
from groundup.errors import DataError
from groundup.io import atomic_write_json
from groundup.layout import DATA_REPORT_FILE, PROCESS_REWARD_FILE, STEP_LABELS_FILE
from groundup.loading import load_for_inference
from groundup.infer import Generator
from groundup.model.heads import StepRewardScores
from groundup.model.loss import IGNORE_INDEX
from groundup.posttrain.config import RMConfig
from groundup.posttrain.pairs import split_heldout
from groundup.posttrain.preference import PreferenceLoader
from groundup.posttrain.prm_labels import label_job, labels_finished
from groundup.posttrain.records import BadRecord, no_usable_held_out, parse_messages
from groundup.posttrain.reward_model import with_value_head
from groundup.posttrain.rollout import read_prompts
from groundup.posttrain.sampling_job import input_settings
from groundup.rewards.functions import load_rewards
from groundup.rewards.process_scorer import step_rows
from groundup.train.objective import ObjectiveOutput
from groundup.train.session import open_run


@dataclass
class StepItem:
    prompt: list[int]  # the chat up to the assistant's turn (what the held-out split hashes)
    ids: list[int]  # prompt + each step's tokens
    ends: list[int]  # each step's last token, in ids
    labels: list[float]  # each step's label in [0, 1]
    meta: dict = field(default_factory=dict)  # split
    index: int = 0


def _labelled(record: dict, where: str, tok, max_len: int) -> StepItem:
    prompt = record.get("prompt", record.get("messages"))
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = parse_messages(prompt, "prompt" if "prompt" in record else "messages")
        if messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if not messages or messages[-1]["role"] != "user":
            raise BadRecord("a chat prompt must end with the user's message")
    steps, labels = record["steps"], record.get("labels")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        raise BadRecord("'steps' must be a non-empty list of strings")
    if not isinstance(labels, list) or len(labels) != len(steps):
        raise BadRecord(f"'labels' must be a list of {len(steps)} numbers, one per step")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in labels):
        raise BadRecord(f"'labels' = {labels[:4]!r}: expected numbers in [0, 1]")
    ids, ends = step_rows(tok, messages, steps)
    kept = [i for i, e in enumerate(ends) if e < max_len]  # steps cut off by the context are not scored
    if not kept:
        raise BadRecord(f"the prompt and first step are {ends[0] + 1} tokens, over the context of {max_len}")
    prompt_ids, _ = tok.render_chat(messages, add_generation_prompt=True)
    meta = {"split": record["split"]} if "split" in record else {}
    return StepItem(prompt_ids, ids[:max_len], [ends[i] for i in kept], [float(labels[i]) for i in kept], meta)


def read_step_items(paths, tok, max_len: int, heldout: bool = False) -> tuple[list[StepItem], list[str], int]:
    """(labelled solutions, skipped "file:line: reason", prompt records without steps (labelled
    elsewhere)); `heldout`: every item is marked held out (--eval-data)."""
    items, bad, prompts = [], [], 0
    for record in iter_records(paths, ReadStats(), require_text=False):
        if "steps" not in record:
            prompts += 1
            continue
        try:
            item = _labelled(record, record.get("_where", "?"), tok, max_len)
        except BadRecord as e:
            bad.append(f"{record.get('_where', '?')}: {e}")
            continue
        if heldout:
            item.meta["split"] = "heldout"
        items.append(item)
    return items, bad, prompts


class StepBatch(NamedTuple):
    inputs: torch.Tensor  # (B, T) right-padded rows
    targets: torch.Tensor  # (B, T) the solution's next tokens (rm.lm_weight's term); ignored elsewhere
    rows: torch.Tensor  # (N,) the row of each step of the batch
    positions: torch.Tensor  # (N,) its last token
    labels: torch.Tensor  # (N,) float in [0, 1]
    index: torch.Tensor  # (B,) item numbers


def make_step_batch(items: list[StepItem], pad_id: int) -> StepBatch:
    x = torch.full((len(items), max(len(it.ids) for it in items)), pad_id, dtype=torch.long)
    t = torch.full_like(x, IGNORE_INDEX)
    for r, it in enumerate(items):
        x[r, : len(it.ids)] = torch.tensor(it.ids)
        t[r, len(it.prompt) - 1 : len(it.ids) - 1] = x[r, len(it.prompt) : len(it.ids)]
    rows = torch.tensor([r for r, it in enumerate(items) for _ in it.ends])
    positions = torch.tensor([e for it in items for e in it.ends])
    labels = torch.tensor([v for it in items for v in it.labels], dtype=torch.float32)
    return StepBatch(x, t, rows, positions, labels, torch.tensor([it.index for it in items]))


class StepLoader(PreferenceLoader):
    """Shuffled epochs over labelled solutions with exact resume (PreferenceLoader's order and state)."""

    def __next__(self) -> StepBatch:
        picked, order = [], self._order()
        while len(picked) < self.batch_size:
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            picked.append(self.items[order[self.position]])
            self.position += 1
        return make_step_batch(picked, self.pad_id)


def step_logits(model, batch: StepBatch, device, with_nll: bool = False):
    """The value head at each step end (logits, (N,)); `with_nll`: and the solutions' mean NLL per token."""
    targets = batch.targets.to(device) if with_nll else None
    out = model(batch.inputs.to(device), targets, StepRewardScores(batch.rows.to(device), batch.positions.to(device)))
    if not with_nll:
        return out.rewards, None
    mask = (targets != IGNORE_INDEX).float()
    return out.rewards, -(out.logprobs.float() * mask).sum() / mask.sum().clamp_min(1)


class ProcessRewardObjective:
    """Binary cross-entropy of each step's value against its label, plus `lm_weight` x the solutions' NLL."""

    name = "prm"

    def __init__(self, heldout: list[StepItem], pad_id: int, lm_weight: float = 0.0):
        self.heldout, self.pad_id, self.lm_weight = heldout, pad_id, lm_weight

    def units(self, batch: StepBatch) -> int:
        return len(batch.labels)

    def __call__(self, model, batch: StepBatch, device) -> ObjectiveOutput:
        logits, nll = step_logits(model, batch, device, with_nll=bool(self.lm_weight))
        labels = batch.labels.to(device)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        metrics = {"loss": loss.detach(), "accuracy": ((logits > 0) == (labels > 0.5)).float().mean(),
                   "good_share": labels.mean(), "score": torch.sigmoid(logits.detach()).mean()}
        if nll is not None:
            metrics["bce_loss"], metrics["solution_nll"] = loss.detach(), nll.detach()
            loss = loss + self.lm_weight * nll
            metrics["loss"] = loss.detach()
        return ObjectiveOutput(loss, metrics)

    @torch.no_grad()
    def evaluate(self, state) -> tuple[dict, str]:
        record = {"step": state.step, "tokens": state.tokens}
        if not self.heldout:
            return record, f"step {state.step}: no held-out solutions"
        model = state.model
        was = model.training
        model.eval()
        bce = right = steps = 0.0
        for i in range(0, len(self.heldout), 16):
            batch = make_step_batch(self.heldout[i : i + 16], self.pad_id)
            with state.precision.context():
                logits, _ = step_logits(model, batch, state.dist.device)
            labels = batch.labels.to(logits.device)
            bce += float(F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="sum"))
            right += float(((logits > 0) == (labels > 0.5)).sum())
            steps += len(labels)
        model.train(was)
        record["val_loss"], record["val_accuracy"] = bce / steps, right / steps
        return record, (f"step {state.step}: held-out step loss {record['val_loss']:.4f}, "
                        f"accuracy {record['val_accuracy']:.3f}")


def _label(run, cfg: RMConfig) -> dict | None:
    """Math-Shepherd labels of the prompts in rm.data / rm.eval_data that carry no steps, into
    RUN/step_labels.jsonl (main process; resumable); the job's record, or None when none was needed."""
    section, prm, tok = cfg.rm, cfg.prm, run.tokenizer
    if labels_finished(run.out / STEP_LABELS_FILE):
        return None
    room = run.model.cfg.max_seq_len - prm.max_new_tokens
    train, held, bad = read_prompts(section.data, tok, room)
    extra, extra_held, extra_bad = read_prompts(section.eval_data, tok, room) if section.eval_data else ([], [], [])
    for p in extra + extra_held:
        p.fields["split"] = "heldout"
    prompts = [p for p in train + held + extra + extra_held if "steps" not in p.fields]
    for reason in (bad + extra_bad)[:3]:
        run.note(f"skipped: {reason}")
    if not prompts:
        return None
    policy = prm.policy or cfg.base
    model, policy_tok = load_for_inference(policy, device=run.dist.device, merge=True)
    if policy_tok.hash != tok.hash:
        raise DataError(f"prm.policy {policy}: its tokenizer differs from the base's ({cfg.base})")
    run.note(f"labelling the steps of {len(prompts):,} prompts' solutions (Math-Shepherd, {prm.estimation} "
             f"estimation: {prm.solutions} solutions x {prm.completions} completions per step)")
    correct = load_rewards([prm.correct])[0]
    settings = {**input_settings(policy, list(section.data) + list(section.eval_data), [prm.correct], [1.0]),
                **{k: getattr(prm, k) for k in ("split", "solutions", "completions", "estimation", "max_new_tokens",
                                                "temperature", "batch_rows")}, "seed": section.seed}
    return label_job(run.out / STEP_LABELS_FILE, settings, Generator(model, tok), tok, prompts, prm, correct,
                     section.seed, progress=cfg.log.progress, stop=run.stop,
                     resume_hint=f"'groundup rm --resume {run.out}'")


def process_rm(cfg: RMConfig, out_dir: str | Path, resume: bool = False) -> dict:
    """Label (when rm.data holds prompts) and train a process reward model from `cfg.base`; the summary."""
    section, prm = cfg.rm, cfg.prm
    with open_run(cfg, out_dir, resume, base=cfg.base) as run:
        d, tok = run.dist, run.tokenizer
        if not section.data:
            raise DataError("no data: pass --data FILE... (prompts with an answer, or solutions labelled per step)")
        run.commit()  # RUN/config.toml before the labelling: a run stopped while labelling resumes it
        if d.is_main:
            atomic_write_json(run.out / PROCESS_REWARD_FILE, {"split": prm.split, "estimation": prm.estimation,
                                                             "policy": prm.policy or cfg.base})
            labelled = _label(run, run.cfg)
        d.barrier()
        seq_len = run.cfg.train.seq_len
        files = list(section.data) + ([run.out / STEP_LABELS_FILE] if (run.out / STEP_LABELS_FILE).is_file() else [])
        items, bad, _ = read_step_items(files, tok, seq_len)
        held_named, held_bad, _ = read_step_items(section.eval_data, tok, seq_len, heldout=True) \
            if section.eval_data else ([], [], 0)
        if section.eval_data and not held_named and not any(x.meta.get("split") == "heldout" for x in items):
            raise no_usable_held_out("--eval-data", section.eval_data, "labelled solution or prompt",
                                     f"{len(held_bad):,} skipped", held_bad[:2])
        train, held = split_heldout(items + held_named, section.val_fraction, section.seed)
        if not train:
            raise DataError(f"no labelled solution to train on ({len(bad) + len(held_bad):,} skipped"
                            + (f"; first: {(bad + held_bad)[0]}" if bad or held_bad else "") + ")")
        for group in (train, held):
            for i, x in enumerate(group):
                x.index = i
        pad = tok.pad_id if tok.pad_id is not None else tok.eot_id
        loader = StepLoader(train, "prm", run.cfg.train.batch_size, pad, seed=section.seed, rank=d.rank,
                            world_size=d.world_size)
        run.steps_from_epochs(section.epochs, len(train), run.cfg.train.batch_size)
        run.commit()  # now with the steps the labelled data gives
        model = with_value_head(run)
        steps = sum(len(x.ends) for x in train)
        good = sum(sum(x.labels) for x in train) / max(steps, 1)
        run.note(f"{len(train):,} labelled solutions ({steps:,} steps, mean label {good:.3f}; {len(held):,} held "
                 f"out), {len(bad) + len(held_bad):,} skipped, {run.cfg.train.max_steps:,} steps")
        if d.is_main:
            atomic_write_json(run.out / DATA_REPORT_FILE, {
                "solutions": len(train), "heldout": len(held), "steps": steps, "mean_label": good,
                "skipped": (bad + held_bad)[:20], "skipped_count": len(bad) + len(held_bad),
                "labelling": labelled["counts"] if labelled else None})
        return run.train(ProcessRewardObjective(held, pad, section.lm_weight), loader, model=model)
