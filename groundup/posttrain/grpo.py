"""`grpo(cfg, out)`: group relative policy optimisation with verifiable rewards, on the training core.

Per completion token t of sequence i (A_i its group-relative advantage, see rollout.py; every
log-probability taken at the sampling temperature, softmax(logits / T), as TRL's trainer does):
    ratio   ρ = exp(log π(t) - log π_old(t))
    policy  -min(ρ A_i, clip(ρ, 1 - ε, 1 + ε_high) A_i)                  (ε_high = ε unless set: DAPO)
    KL      β (exp(r - log π(t)) - (r - log π(t)) - 1),  r = log π_ref(t)  (the k3 estimator; β = 0: none)
and the per-token losses are aggregated (TRL's loss types):
    sequence   mean over sequences of each sequence's token mean           (GRPO)
    token      sum over all completion tokens / their number               (DAPO)
    dr_grpo    sum over all completion tokens / (sequences x max_new_tokens) (Dr. GRPO)
With tools (grpo.tools) a completion is a multi-turn rollout (tool_rollout.py): "completion tokens" are
the ids the policy sampled in all its turns, never the tool results or the turn tokens inserted around
them, for the ratio, the KL (the reference scores the same targets) and the aggregation alike (Dr.
GRPO's max_new_tokens is then per turn). Logged per step: loss, reward mean and std, each reward
component, KL, clip fraction, entropy, completion length, the share of completions cut at
max_new_tokens, the share of malformed chat replies (ended by the document-end token: rollout.py),
groups skipped for having nothing to teach, and with tools the calls and failed calls per rollout.
The reference is the starting model: under LoRA the base with the adapter off (no second copy);
otherwise a frozen copy, kept only when β > 0.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from groundup.errors import ConfigError, DataError
from groundup.infer import Generator
from groundup.io import atomic_write_json
from groundup.layout import DATA_REPORT_FILE
from groundup.model.logprobs import logprobs
from groundup.posttrain.config import GRPOConfig
from groundup.posttrain.rollout import (RolloutBatch, RolloutLoader, no_usable_eval_prompts, policy_temperature,
                                         read_prompts)
from groundup.posttrain.tool_rollout import roll_out, tool_runner
from groundup.rewards.functions import load_rewards, score
from groundup.train.distributed import unwrap
from groundup.train.objective import ObjectiveOutput
from groundup.train.session import open_run


def grpo_token_loss(logp: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, ref: torch.Tensor | None,
                    epsilon: float, epsilon_high: float, beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-token loss, per-token KL or zeros, clipped indicator) for (N, T) log-probs."""
    ratio = torch.exp(logp - old)
    adv = advantages[:, None]
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + (epsilon_high or epsilon))
    per = -torch.min(ratio * adv, clipped * adv)
    kl = torch.zeros_like(per)
    if beta and ref is not None:
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        per = per + beta * kl
    was_clipped = ((ratio * adv) > (clipped * adv)).float()
    return per, kl, was_clipped


def aggregate(per: torch.Tensor, mask: torch.Tensor, how: str, max_new_tokens: int) -> torch.Tensor:
    if how == "sequence":
        return ((per * mask).sum(-1) / mask.sum(-1).clamp_min(1)).mean()
    if how == "token":
        return (per * mask).sum() / mask.sum().clamp_min(1)
    if how == "dr_grpo":
        return (per * mask).sum() / (per.shape[0] * max_new_tokens)
    raise ValueError(f"unknown loss aggregation {how!r}")


@dataclass
class GRPOObjective:
    cfg: object  # GRPOSection
    heldout: list | None = None
    rewards: list | None = None
    tokenizer: object = None
    runner: object = None  # the tools the policy calls (a ToolRunner), or None
    name: str = "grpo"

    def metric_names(self) -> list[str]:
        """The same names every micro-batch and process reports (the core sums them across both)."""
        return ["loss", "kl", "clip_fraction", "reward", "reward_std", *[f"reward/{r.name}" for r in self.rewards],
                "completion_length", "truncated", "malformed", "entropy", "uninformative_groups",
                *(["tool_calls", "tool_errors"] if self.runner is not None else [])]

    def _metrics(self, values: dict) -> dict:
        return {k: values.get(k, 0.0) for k in self.metric_names()}

    def units(self, batch: RolloutBatch) -> int:
        if self.cfg.loss_aggregation == "token":
            return int((batch.targets != -100).sum())
        return len(batch.advantages)

    def tokens(self, batch: RolloutBatch) -> int:
        return int(batch.inputs.numel())

    def __call__(self, model, batch: RolloutBatch, device) -> ObjectiveOutput:
        c = self.cfg
        if not (batch.targets != -100).any():  # nothing to learn: every group alike, or every reply cut off and masked
            zero = sum(p.sum() * 0 for p in model.parameters() if p.requires_grad)
            return ObjectiveOutput(zero, self._metrics(batch.stats))
        targets = batch.targets.to(device)
        mask = (targets != -100).float()
        logp = logprobs(model, batch.inputs.to(device), targets, temperature=policy_temperature(c))
        ref = batch.ref_logps.to(device) if batch.ref_logps is not None else None
        per, kl, clipped = grpo_token_loss(logp, batch.old_logps.to(device), batch.advantages.to(device), ref,
                                           c.epsilon, c.epsilon_high, c.beta)
        loss = aggregate(per, mask, c.loss_aggregation, c.max_new_tokens)
        n = mask.sum().clamp_min(1)
        metrics = {**batch.stats, "loss": loss.detach(), "kl": ((kl * mask).sum() / n).detach(),
                   "clip_fraction": (clipped * mask).sum() / n}
        return ObjectiveOutput(loss, self._metrics(metrics))

    @torch.no_grad()
    def evaluate(self, state) -> tuple[dict, str]:
        record = {"step": state.step, "tokens": state.tokens}
        prompts = (self.heldout or [])[: self.cfg.eval_count]
        if not prompts or state.dist.strategy == "fsdp":
            return record, f"step {state.step}: no held-out prompts"
        gen = Generator(unwrap(state.model), self.tokenizer)
        outs = []
        for i in range(0, len(prompts), 16):
            if self.runner is not None:  # the final answer after the tool calls
                outs += roll_out(gen, prompts[i : i + 16], self.runner, self.cfg.max_tool_calls,
                                 max_new_tokens=self.cfg.max_new_tokens, temperature=0)
            else:
                outs += gen.complete_ids([p.ids for p in prompts[i : i + 16]],
                                         max_new_tokens=self.cfg.max_new_tokens, temperature=0)
        sums: dict[str, float] = {}
        for p, o in zip(prompts, outs):
            total, parts, _ = score(self.rewards, p.text, o.text, p.fields, p.messages)
            for k, v in {"reward": total, **{f"reward/{k}": v for k, v in parts.items()}}.items():
                sums[k] = sums.get(k, 0.0) + v
        record.update({f"val_{k}": v / len(prompts) for k, v in sums.items()})
        return record, f"step {state.step}: held-out (greedy) reward {record['val_reward']:.3f}"


def grpo(cfg: GRPOConfig, out_dir: str | Path, resume: bool = False) -> dict:
    """GRPO of `cfg.base` on `cfg.grpo.prompts` with `cfg.grpo.rewards`; returns the training summary."""
    g = cfg.grpo
    rewards = load_rewards(g.rewards, g.reward_weights)  # a bad reward name fails before anything is loaded
    with open_run(cfg, out_dir, resume, base=cfg.base) as run:
        cfg, d, tok, note = run.cfg, run.dist, run.tokenizer, run.note
        if not g.prompts:
            raise DataError("no GRPO prompts: pass --prompts FILE... (JSONL/Parquet: prompt or messages, + answer)")
        context = run.model.cfg.max_seq_len - g.max_new_tokens
        if context < 1:
            raise ConfigError(f"grpo.max_new_tokens = {g.max_new_tokens}: at or over the model's context "
                              f"({run.model.cfg.max_seq_len} tokens); leave room for the prompt",
                              key="grpo.max_new_tokens")
        runner = tool_runner(g.tools)
        shown = runner.schemas() if runner is not None else None
        train, held, bad = read_prompts(g.prompts, tok, context, shown)
        if g.eval_prompts:
            unmarked, marked, bad2 = read_prompts(g.eval_prompts, tok, context, shown)
            held, bad = unmarked + marked, bad + bad2  # every prompt of an eval file is held out, marked or not
            if not held:
                raise no_usable_eval_prompts(g.eval_prompts, bad2)
        if bad:
            note(f"skipped {len(bad):,} prompt records: " + "; ".join(bad[:3]))
        if not cfg.train.max_steps:
            raise DataError("train.max_steps is not set: GRPO runs for a number of steps, not epochs")
        run.commit()
        # The KL term's reference: the base as it starts (under LoRA, the base with its adapters disabled,
        # so no second copy exists).
        reference = None
        if g.beta and not cfg.lora.enabled:
            reference = copy.deepcopy(run.model).eval().requires_grad_(False).to(d.device)
        loader = RolloutLoader(train, g, rewards, tok, seed=g.seed, rank=d.rank, world_size=d.world_size,
                               accum=cfg.train.grad_accum, reduce=d.sum, runner=runner)
        note(f"{len(train):,} prompts ({len(held):,} held out), {g.group_size} completions each, "
             f"{g.prompts_per_batch} prompts per micro-batch, {cfg.train.max_steps:,} steps")
        if d.is_main and not resume:
            atomic_write_json(run.out / DATA_REPORT_FILE, {"prompts": len(train), "heldout": len(held),
                                                           "skipped": bad[:20], "rewards": g.rewards,
                                                           **dataclasses.asdict(g)})
        summary = run.train(GRPOObjective(g, held, rewards, tok, runner), loader,
                            on_start=lambda state: loader.bind(unwrap(state.model), reference))
        summary["reward_errors"] = len(loader.errors)
        if loader.errors:
            note(f"{len(loader.errors):,} reward calls failed and scored 0: " + "; ".join(loader.errors[:3]))
        if loader.health.flat > 0:  # a run shorter than grpo.reward_patience steps, that never had anything to learn
            note(f"nothing was learned: every prompt's completions scored alike in all {loader.health.flat} steps")
        return summary
