"""What the rest of the demo costs on this machine now, in seconds, from what was measured.

    least(stage) = start-up + (FEW_STEPS[stage] + 1) steps + its final evaluation            x slowdown
    rows         = each report-card row still to come at the dearest row measured; the base row also
                   answers its math in the pretraining format (as dear as its chat part), the int8 row
                   runs its forwards at the int8 price (demo/measure.py)                      x slowdown
    fixed        = samples, exports, quantization and the report: quiet-machine seconds      x load x slowdown

The `+ 1` step: a time-limited run stops when the step after next would not fit; a few steps are
fewer than the seven after which it would time an evaluation for its plan (train/time_budget.py), so
the final evaluation is the only one.

The measurements (Costs.measured): a training step and evaluation forwards of the untrained model
(demo/measure.py) and the untrained model's report-card row, whose chat replies run to the token limit
and so price a generated token. All of them are taken at the load of the moment; `slowdown` is how much
slower the machine is now than then (pretraining measures it on its own steps: demo/watch.py), and
`load` (load average per core, at least 1) scales the few constants measured on a quiet machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from groundup.demo.scorecard import scaled

FEW_STEPS = {"pretrain": 5, "sft": 5, "align": 3}  # the least a training stage runs: a few steps
# A training verb's start-up before its first step on a quiet 2-core machine (SFT renders its conversations)
STARTUP_S = {"pretrain": 2.0, "sft": 8.0, "align": 3.0}
FIXED_S = {"samples": 2.0, "exports": 1.0, "quantize": 1.0, "arena": 12.0, "report": 4.0}  # quiet 2-core machine
ROW_MARGIN = 1.1  # a later row may take a little longer than the one measured (longer replies)
PROMPT_TOKENS = 32  # a rendered chat-math prompt, about (GRPO rollouts, DPO pairs)
REFERENCE_FORWARD = 1 / 3  # a reference model's forward: a third of a training step's tokens
DOMAINS = 3  # validation domains a pretraining evaluation reads (text, code, math)


@dataclass
class Costs:
    train_tps: float  # training tokens per second (forward and backward)
    forward_tps: float  # evaluation forward tokens per second (float weights)
    int8_ratio: float  # an int8 forward's seconds over a float one's
    generate_s: float  # seconds per generated token of one sequence (batched greedy decoding)
    row_s: float  # the dearest report-card row measured
    row_parts: dict[str, float]  # that row's seconds per part (demo/scorecard.py: bpb, chats, ...)
    load: float = 1.0  # load average per core when measured, at least 1
    slowdown: float = 1.0  # how much slower the machine is now than when these were measured
    overrun_s: float = 0.0  # the most a finished training stage took beyond its limit

    @classmethod
    def measured(cls, machine: dict, row: dict) -> Costs:
        """From demo/measure.py's result and the untrained model's row (with its `work` counts)."""
        work = row.get("work") or {}
        tokens = max(1, work.get("reply_tokens", 0))
        return cls(train_tps=machine["train_tokens"] / machine["train_step_s"],
                   forward_tps=machine["forward_tokens"] / machine["forward_s"],
                   int8_ratio=max(1.0, machine["int8_forward_s"] / machine["forward_s"]),
                   generate_s=row["timings"].get("chats", 0.0) / tokens, row_s=row["seconds"],
                   row_parts=dict(row["timings"]), load=max(1.0, machine["load"] / max(1, machine["cores"])))

    def replace(self, **changes) -> Costs:
        return dataclasses.replace(self, **changes)

    def with_row(self, row: dict) -> Costs:
        """These costs with a newly measured row, when it is the dearest so far (the base row's native-format
        math left out: no later row asks it)."""
        parts = {k: v for k, v in row["timings"].items() if k != "native_math"}
        seconds = row["seconds"] - row["timings"].get("native_math", 0.0)
        if seconds <= self.row_s * self.slowdown:
            return self
        return self.replace(row_s=seconds / self.slowdown, row_parts={k: v / self.slowdown for k, v in parts.items()})

    # ------------------------------------------------------------------ the currencies

    def step(self, tokens: float) -> float:
        return tokens / self.train_tps * self.slowdown

    def forward(self, tokens: float) -> float:
        return tokens / self.forward_tps * self.slowdown

    def generate(self, sequences: int, tokens: int) -> float:
        return sequences * tokens * self.generate_s * self.slowdown

    def startup(self, stage: str) -> float:
        return STARTUP_S[stage] * self.load * self.slowdown

    def fixed(self, *names: str) -> float:
        return sum(FIXED_S[n] for n in names) * self.load * self.slowdown

    # ------------------------------------------------------------------ what is still to come

    def least(self, stage: str, cfg, scale: float) -> float:
        """The least seconds training stage `stage` of DemoConfig `cfg` takes: a few steps and its evaluations."""
        sampled = 0.0  # DPO's pairs, sampled inside its limit
        if stage == "pretrain":
            p = cfg.pretrain
            tokens = p.train.batch_size * p.train.seq_len
            step, evaluation = self.step(tokens), self.forward(DOMAINS * p.eval.max_batches * tokens)
        elif stage == "sft":
            s = cfg.sft
            step = self.step(s.train.batch_size * s.train.seq_len)
            evaluation = self.generate(scaled(s.sft.eval_generations, scale), s.sft.eval_max_new_tokens)
        elif cfg.align == "grpo":
            g = cfg.grpo.grpo
            rollouts = g.group_size * g.prompts_per_batch
            step = (self.generate(rollouts, g.max_new_tokens)
                    + self.step(rollouts * (PROMPT_TOKENS + g.max_new_tokens)) * (1 + REFERENCE_FORWARD))
            evaluation = self.generate(scaled(g.eval_count, scale), g.max_new_tokens)
        else:  # DPO: the pairs are sampled first, inside the stage's limit
            d, p = cfg.dpo, cfg.pairs
            prompts = scaled(p.prompts, scale) + scaled(p.prompts // 4, scale)
            sampled = self.startup(stage) + self.generate(prompts * p.samples, p.max_new_tokens)
            step = self.step(2 * d.train.batch_size * d.train.seq_len) * (1 + REFERENCE_FORWARD)
            evaluation = self.forward(2 * d.train.batch_size * d.train.seq_len)
        return self.startup(stage) + sampled + (FEW_STEPS[stage] + 1) * step + evaluation

    def row(self, name: str) -> float:
        """Seconds of the report-card row of model `name` (untrained, base, sft, aligned, aligned-int8)."""
        parts = self.row_parts
        extra = 0.0
        if name == "base":  # its math again, asked in the pretraining format
            extra = parts.get("chats", 0.0)
        elif name.endswith("int8"):  # its batched forwards at the int8 price
            extra = (self.int8_ratio - 1) * (parts.get("bpb", 0.0) + parts.get("multiple_choice", 0.0)
                                             + parts.get("decode", 0.0))
        return (self.row_s * ROW_MARGIN + extra) * self.slowdown

    def to_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}

