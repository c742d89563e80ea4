"""GRPO's data: prompts in, scored groups of the policy's own completions out, a batch at a time.

    prompts, bad = read_prompts(files, tok)           # text or chat prompts with their fields (answer, tests)
    loader = RolloutLoader(prompts, cfg.grpo, rewards, tok, seed, rank, world)
    loader.bind(policy, reference)                    # the model to sample from (and the KL reference)
    batch = next(loader)                              # RolloutBatch: G completions of each of P prompts

Each batch samples `group_size` completions for each of `prompts_per_batch` prompts through the
generation engine (KV cache, batched), with the old log-probability of every sampled token, scores
them with the rewards, and turns rewards into advantages within each group: (r - mean) / (std + 1e-4)
(std is the group's sample standard deviation, as TRL's), or r - mean without scaling (Dr. GRPO).
A group whose rewards are all equal teaches nothing: it is counted and left out, and when every group
of a batch is such, new prompts are drawn (up to `max_resample` times). A run whose rewards fail on
every call, or tell no group's completions apart, for `reward_patience` steps stops with an error that
says why (rewards/health.py). With `mask_truncated` a
completion cut off at `max_new_tokens` keeps its place in its group's advantages but no token of it
is trained on (its targets are ignored), as TRL's mask_truncated_completions. An optimizer step takes
`grad_accum` batches, all sampled from the policy before the step; with `iterations` > 1 the same
batches are used for that many steps, their old log-probs fixed at sampling.

With a tool runner (grpo.tools) a chat prompt rolls out multi-turn (tool_rollout.py: calls run, their
results appended), the rewards judge the final answer, and the targets are the ids the policy sampled
in all its turns: tool results and the turn tokens inserted around them are ignored (IGNORE_INDEX), the
old and reference log-probs aligned with the same targets. A chat reply (any turn) that stops at the
document-end token instead of the end of turn is malformed, the format drift GRPO on chat prompts
showed: it scores `malformed_penalty` below the lowest reward of its group (`penalize_malformed`).

Exact resume: the prompt order is a seeded permutation per epoch, each batch's sampling seed derives
from (seed, rank, batch number) (a tool rollout's turns too, and the tools give the same results: a
tool that times out now and then does not), and a batch still being iterated on is saved with the loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from groundup.data.readers import ReadStats, iter_records
from groundup.errors import CheckpointError, DataError
from groundup.infer import Generator
from groundup.model.logprobs import logprobs
from groundup.model.lora import adapters_disabled
from groundup.model.loss import IGNORE_INDEX
from groundup.posttrain.records import BadRecord, no_usable_held_out, parse_messages, parse_tools
from groundup.posttrain.tool_rollout import roll_out
from groundup.rewards.functions import score_each
from groundup.rewards.health import BatchTally, RewardHealth
from groundup.tools import ToolRunner


def policy_temperature(cfg) -> float:
    """The temperature GRPO's log-probabilities (policy, old and reference) are taken at: the sampling
    temperature, as TRL's trainer divides the logits by it; 1 for greedy sampling."""
    return cfg.temperature if cfg.temperature > 0 else 1.0


@dataclass
class Prompt:
    ids: list[int]
    text: str  # what rewards see as the prompt
    fields: dict = field(default_factory=dict)  # the record's other fields (answer, tests, ...), passed to rewards
    messages: list[dict] | None = None  # a chat prompt's messages
    tools: list[dict] | None = None  # with tool use on: the definitions the model reads (the record's, or the runner's)


def read_prompts(paths, tok, max_len: int, tools: list[dict] | None = None) -> tuple[list[Prompt], list[Prompt],
                                                                                        list[str]]:
    """(training prompts, held-out prompts, skipped "file:line: reason"). A `messages` record that ends with
    the reply to its last user message (an assistant message, or a tool loop: calls, results, the answer) is
    a prompt without that reply (so SFT and tool-use chat files serve as prompts). `tools`: tool
    use is on, and these are the definitions a chat prompt shows unless its record has a `tools` list of
    its own; a text prompt is then skipped (tools need a chat)."""
    train, held, bad = [], [], []
    for record in iter_records(paths, ReadStats(), require_text=False):
        where = record.get("_where", "?")
        try:
            fields = {k: v for k, v in record.items() if not k.startswith("_") and k not in ("prompt", "messages", "id",
                                                                                               "source", "domain")}
            shown = None
            if "messages" in record or isinstance(record.get("prompt"), list):
                messages = parse_messages(record.get("messages", record.get("prompt")), "messages")
                users = [i for i, m in enumerate(messages) if m["role"] == "user"]
                if users and messages[-1]["role"] in ("assistant", "tool"):
                    # the reply to the last user message (with its calls and their results: a tool-use
                    # chat) is what the policy writes: the prompt ends with that user message
                    messages = messages[: users[-1] + 1]
                if not messages or messages[-1]["role"] != "user":
                    raise BadRecord("a chat prompt must end with the user's message")
                shown = (parse_tools(record.get("tools")) or tools) if tools is not None else None
                try:
                    ids, _ = tok.render_chat(messages, add_generation_prompt=True, tools=shown)
                except DataError as e:  # a record's malformed `tools` list
                    raise BadRecord(str(e)) from None
                text = messages[-1]["content"]
            elif tools is not None:
                raise BadRecord("a text prompt cannot call tools: give a chat prompt (messages) with tool use on")
            elif isinstance(record.get("prompt"), str):
                text, messages = record["prompt"], None
                ids = list(tok.prefix_ids) + tok.encode(text)
            else:
                raise BadRecord("expected 'prompt' (text or messages) or 'messages'")
            if len(ids) >= max_len:
                raise BadRecord(f"the prompt is {len(ids)} tokens, no room left in a context of {max_len}")
            (held if fields.get("split") == "heldout" else train).append(Prompt(ids, text, fields, messages,
                                                                                  shown))
        except BadRecord as e:
            bad.append(f"{where}: {e}")
    return train, held, bad


def no_usable_eval_prompts(paths, bad: list[str]) -> DataError:
    return no_usable_held_out("--eval-prompts", paths, "prompt", f"{len(bad):,} skipped", bad[:1])


@dataclass
class ScoredSamples:
    outs: list  # k completions of each prompt, prompt-major
    totals: list[float]  # their weighted rewards (a failed reward counts 0)
    parts: dict[str, list[float]]  # each reward's values
    failed: list[bool]  # some reward failed on this completion: its total is no judgement of it
    tally: BatchTally  # all of them: samples, failures per reward, prompts whose samples varied


def _varies(scores: list[float]) -> bool:
    return max(scores) > min(scores)


def sample_scored(gen: Generator, prompts: list[Prompt], rewards, k: int, errors: list[str] | None = None,
                  batch_rows: int = 32, progress: bool = False, health: RewardHealth | None = None,
                  runner: ToolRunner | None = None, max_tool_calls: int = 4, **sampling) -> ScoredSamples:
    """k completions of each prompt (prompt-major), scored by the rewards; reward failures are appended
    to `errors` as "prompt: reason" (they score 0). Rows are sampled `batch_rows` at a time (the KV cache
    grows with rows x context), each batch with its own seed and scored as it comes; `health` is given
    each batch's tally (with the whole prompts finished in it) and stops a run whose rewards never work.
    With a tool `runner` each row is a multi-turn ToolRollout (tool_rollout.py) and the rewards judge its
    final answer (`.text`)."""
    from tqdm import tqdm

    rows = [p for p in prompts for _ in range(k)]
    result = ScoredSamples([], [], {r.name: [] for r in rewards}, [], BatchTally())
    pending, tallied = BatchTally(), 0  # not yet given to `health`; prompts whose samples are all tallied
    with tqdm(total=len(rows), desc="sampling", unit=" samples", disable=not progress, leave=False) as bar:
        for i in range(0, len(rows), batch_rows):
            seed = sampling.get("seed", 0) + i
            if runner is None:
                outs = gen.complete_ids([p.ids for p in rows[i : i + batch_rows]], **{**sampling, "seed": seed})
            else:
                outs = roll_out(gen, rows[i : i + batch_rows], runner, max_tool_calls, **{**sampling, "seed": seed})
            bar.update(len(outs))
            for j, o in enumerate(outs, start=i):
                p = prompts[j // k]
                s = score_each(rewards, p.text, o.text, p.fields, p.messages)
                if s.errors and errors is not None:
                    name = next(iter(s.errors))
                    errors.append(f"{p.text[:60]!r}: {name}: {s.errors[name]}")
                result.outs.append(o)
                result.totals.append(s.total)
                result.failed.append(bool(s.errors))
                for name, v in s.parts.items():
                    result.parts[name].append(v)
                pending.add(BatchTally(1, dict.fromkeys(s.errors, 1), 0, s.total, s.errors))
            finished = len(result.totals) // k
            if finished > tallied:  # a batch's tally counts whole prompts: whether their samples varied
                pending.varied = sum(_varies(result.totals[q * k : (q + 1) * k]) for q in range(tallied, finished))
                result.tally.add(pending)
                if health is not None:
                    health.update(pending)
                pending, tallied = BatchTally(), finished
    return result


@dataclass
class RolloutBatch:
    inputs: torch.Tensor  # (N, T) prompt + completion, right-padded
    targets: torch.Tensor  # (N, T) completion tokens only
    old_logps: torch.Tensor  # (N, T) log-probs at sampling, aligned with targets (0 elsewhere)
    ref_logps: torch.Tensor | None  # (N, T) the reference's, when the KL is on
    advantages: torch.Tensor  # (N,)
    stats: dict  # reward mean/std/components, lengths, truncation, skipped groups (for the log)


def ends_document(prompt: Prompt, out, tok) -> bool:
    """A chat reply (any turn of a tool rollout) that stopped at the document-end token instead of the end
    of turn: malformed. SFT taught the end of turn, but the engine stops at either, so nothing else keeps
    such endings from being reinforced (the format drift of GRPO on chat prompts). A text prompt's
    completion rightly ends at the document end; where the two are one token (many Hugging Face
    tokenizers) no reply is malformed. Only sampled ids count: the engine stops at a sampled end token."""
    eot, eos = tok.end_of_turn_id, tok.eot_id
    if prompt.messages is None or eot is None or eos is None or eot == eos:
        return False
    sampled = getattr(out, "generated", None) or [True] * len(out.token_ids)
    return any(i == eos and g for i, g in zip(out.token_ids, sampled))


def penalize_malformed(totals: list[float], malformed: list[bool], group_size: int, penalty: float) -> list[float]:
    """Each malformed reply's reward as `penalty` below the lowest of its group (its own included), so its
    advantage is the group's lowest whatever its rewards said; the others' are unchanged. A mask could
    only stop reinforcing such an ending; the penalty also unlearns the drift a model already has."""
    if not penalty:
        return list(totals)
    out = list(totals)
    for start in range(0, len(totals), group_size):
        low = min(totals[start : start + group_size])
        for i in range(start, min(start + group_size, len(totals))):
            if malformed[i]:
                out[i] = low - penalty
    return out


class RolloutLoader:
    def __init__(self, prompts: list[Prompt], cfg, rewards, tok, seed: int = 0, rank: int = 0, world_size: int = 1,
                 accum: int = 1, reduce=None, runner: ToolRunner | None = None):
        """`runner`: the tools the policy calls while it replies (cfg.max_tool_calls at most); None = none."""
        if not prompts:
            raise DataError("no usable GRPO prompts (see the skipped records above)")
        self.prompts, self.cfg, self.rewards, self.tok, self.runner = prompts, cfg, rewards, tok, runner
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.batch_size = cfg.prompts_per_batch  # prompts per batch (what a resume must agree on)
        self.epoch, self.position, self.batches, self.iteration, self.accum = 0, 0, 0, 0, accum
        self.cached: list[RolloutBatch] = []  # this step's batches, reused for `iterations` steps
        self.pos = 0  # the next of them
        self.policy = self.reference = None
        self.errors: list[str] = []  # reward failures, "prompt: reason"
        # rewards that never work stop the run: judged on each step's samples, summed over processes by
        # `reduce` (Dist.sum), so that every process stops at the same step
        self.health = RewardHealth([r.name for r in rewards], cfg.reward_patience, "steps", "grpo.reward_patience = 0")
        self.reduce = reduce or (lambda values: values)
        self.tally = BatchTally()  # the step being drawn

    def bind(self, policy, reference=None) -> None:
        """The model to sample from; `reference` a frozen copy, or None (LoRA: the adapter switched off)."""
        self.policy, self.reference = policy, reference

    def _take(self, n: int) -> list[Prompt]:
        out = []
        while len(out) < n:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.prompts))
            mine = order[self.rank :: self.world_size] if len(order) >= self.world_size else order
            if self.position >= len(mine):
                self.epoch, self.position = self.epoch + 1, 0
                continue
            out.append(self.prompts[mine[self.position]])
            self.position += 1
        return out

    def __iter__(self):
        return self

    def __next__(self) -> RolloutBatch:
        if self.pos >= len(self.cached):  # the step's batches are used up: another pass, or new samples
            if self.cached and self.iteration < self.cfg.iterations:
                self.iteration += 1
            else:
                self.tally = BatchTally()
                self.cached, self.iteration = [self._draw() for _ in range(self.accum)], 1
                names = self.health.names
                self.health.update(BatchTally.from_list(self.reduce(self.tally.as_list(names)), names,
                                                        self.tally.errors))
            self.pos = 0
        self.pos += 1
        return self.cached[self.pos - 1]

    def _draw(self) -> RolloutBatch:
        skipped = 0
        for _ in range(self.cfg.max_resample):
            batch = self._sample(self._take(self.cfg.prompts_per_batch))
            self.batches += 1
            if batch is not None:
                break
            skipped += self.cfg.prompts_per_batch
        else:
            batch = self._empty()
        batch.stats["uninformative_groups"] = batch.stats.get("uninformative_groups", 0) + skipped
        return batch

    @torch.no_grad()
    def _sample(self, prompts: list[Prompt]) -> RolloutBatch | None:
        c, G = self.cfg, self.cfg.group_size
        seed = int(np.random.default_rng([self.seed, self.rank, self.batches]).integers(1 << 31))
        scored = sample_scored(Generator(self.policy, self.tok), prompts, self.rewards, G, self.errors,
                               runner=self.runner, max_tool_calls=c.max_tool_calls,
                               max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p, seed=seed,
                               logprobs=True, logprob_temperature=policy_temperature(c))
        self.tally.add(scored.tally)
        outs, parts = scored.outs, scored.parts
        # a tool rollout renders its own prompt (with the tools' definitions); a plain one samples after p.ids
        rows = [o.prompt_ids if self.runner is not None else prompts[i // G].ids for i, o in enumerate(outs)]
        malformed = [ends_document(prompts[i // G], o, self.tok) for i, o in enumerate(outs)]
        totals = penalize_malformed(scored.totals, malformed, G, c.malformed_penalty)
        r = torch.tensor(totals).view(len(prompts), G)
        entropies = [h for o in outs for h in (getattr(o, "entropies", None) or [])]  # a ToolRollout has none
        informative = (r.max(dim=1).values - r.min(dim=1).values) > 0
        stats = {"reward": r.mean().item(), "reward_std": r.std(dim=1).mean().item(),
                 **{f"reward/{k}": float(np.mean(v)) for k, v in parts.items()},
                 "completion_length": float(np.mean([len(o.token_ids) for o in outs])),
                 "truncated": float(np.mean([o.finish_reason == "length" for o in outs])),
                 "malformed": float(np.mean(malformed)),
                 **({"tool_calls": float(np.mean([o.tool_calls for o in outs])),
                     "tool_errors": float(np.mean([o.tool_errors for o in outs]))} if self.runner is not None else {}),
                 "entropy": float(np.mean(entropies)) if entropies else 0.0,
                 "uninformative_groups": int((~informative).sum())}
        if not informative.any():
            return None
        adv = r - r.mean(dim=1, keepdim=True)
        if c.scale_rewards:
            adv = adv / (r.std(dim=1, keepdim=True) + 1e-4)
        keep = [i for i in range(len(outs)) if informative[i // G]]
        return self._tensors([rows[i] for i in keep], [outs[i] for i in keep], adv.view(-1)[keep], stats)

    def _tensors(self, rows, outs, advantages, stats) -> RolloutBatch:
        """The batch's tensors: targets on the sampled ids only (a tool rollout's results and the turn
        tokens inserted around them are ignored, its `generated` mask), old log-probs aligned with them;
        with `mask_truncated` a cut-off completion's targets are all ignored."""
        T = max(len(p) + len(o.token_ids) for p, o in zip(rows, outs)) - 1
        pad = self.tok.pad_id if self.tok.pad_id is not None else self.tok.eot_id
        x = torch.full((len(rows), T), pad, dtype=torch.long)
        t = torch.full((len(rows), T), IGNORE_INDEX, dtype=torch.long)
        old = torch.zeros(len(rows), T)
        for i, (p, o) in enumerate(zip(rows, outs)):
            seq = torch.tensor(p + o.token_ids)
            x[i, : len(seq) - 1] = seq[:-1]
            if not (self.cfg.mask_truncated and o.finish_reason == "length"):
                sampled = seq[len(p):].clone()
                if getattr(o, "generated", None) is not None:  # a multi-turn rollout: only what the policy sampled
                    sampled[~torch.tensor(o.generated, dtype=torch.bool)] = IGNORE_INDEX
                t[i, len(p) - 1 : len(seq) - 1] = sampled
            old[i, len(p) - 1 : len(seq) - 1] = torch.tensor(o.logprobs)
        ref = None
        if self.cfg.beta:
            device = next(self.policy.parameters()).device
            was = self.policy.training
            self.policy.eval()
            if self.reference is not None:
                ref = logprobs(self.reference, x.to(device), t.to(device), temperature=policy_temperature(self.cfg)).cpu()
            else:
                with adapters_disabled(self.policy):
                    ref = logprobs(self.policy, x.to(device), t.to(device),
                                   temperature=policy_temperature(self.cfg)).cpu()
            self.policy.train(was)
        return RolloutBatch(x, t, old, ref, advantages.float(), stats)

    def _empty(self) -> RolloutBatch:
        z = torch.zeros(0, 1, dtype=torch.long)
        return RolloutBatch(z, z, torch.zeros(0, 1), None, torch.zeros(0), {})

    def state_dict(self) -> dict:
        state = {"version": 1, "epoch": self.epoch, "position": self.position, "batches": self.batches,
                 "iteration": self.iteration, "pos": self.pos, "prompts": len(self.prompts), "seed": self.seed,
                 "batch_size": self.batch_size, "health": self.health.state_dict()}
        if self.iteration < self.cfg.iterations or self.pos < len(self.cached):  # still to be used: keep them
            state["cached"] = [vars(b) for b in self.cached]
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("prompts") != len(self.prompts) or state.get("seed") != self.seed:
            raise CheckpointError("cannot resume the GRPO prompts: the prompt files or the seed changed")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.batches, self.iteration, self.pos = int(state["batches"]), int(state["iteration"]), int(state["pos"])
        self.cached = [RolloutBatch(**b) for b in state.get("cached") or []]
        self.health.load_state_dict(state.get("health") or {})
        if not self.cached:
            self.pos = 0
