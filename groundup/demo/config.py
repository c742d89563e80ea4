"""The demo's settings: one section per stage, each the stage's own config dataclass.

`groundup demo pretrain.optim.name=adamw tokenizer.vocab_size=8192` changes one stage's setting the
same way `groundup train optim.name=muon` would; the demo writes each stage's resolved config to
OUT/configs/ and runs the stage's own command on it, so every stage can be rerun by hand.

The recipe (model size, optimizer, schedule, batch, mix) is the result of the ablation in
docs/demo-recipe.md: the lowest held-out Shakespeare bits-per-byte within a 15-minute budget on a
2-core CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from groundup.config import fail, from_dict
from groundup.data.curate_config import CurateConfig
from groundup.demo.scorecard import ScorecardConfig
from groundup.posttrain.config import DPOConfig, GRPOConfig, SFTConfig
from groundup.tokens.shards import TokenizeConfig
from groundup.tokenizer.train import TokenizerConfig
from groundup.train.config import TrainConfig

# Every Shakespeare record names its `work`, the same for both editions and all chunks of a play.
WORKS = "work"

# The demo's model: sized for a 2-core CPU and a 15-minute budget (docs/demo-recipe.md).
# Small and fast wins at this budget: more tokens through a smaller model beat a wider or deeper one.
# Pretraining reads 128-token windows; the context is 512 so that a tool-use conversation (the tools'
# definitions alone are ~300 tokens) fits, and SFT trains the longer positions.
DEMO_MODEL = {"preset": "tiny", "d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "d_ff": 384,
              "max_seq_len": 512, "tie_embeddings": True}


def _pretrain() -> TrainConfig:
    return from_dict(TrainConfig, {
        "model": DEMO_MODEL,
        # max_steps is a first guess: the run re-plans it from its measured steps (train.time_limit_s)
        "train": {"batch_size": 32, "seq_len": 128, "max_steps": 2000, "threads": -1},
        "checkpoint": {"every": 400},
        # Muon on the hidden matrices (AdamW on embeddings and norms), its update scaled to AdamW's
        # RMS so one peak rate drives both: 0.07 bits/byte better than AdamW at the same time.
        "optim": {"name": "muon", "weight_decay": 0.1, "grad_clip": 1.0},
        "schedule": {"kind": "cosine", "peak_lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 50},
        "precision": {"mode": "fp32"},
        "eval": {"max_batches": 8, "every": 400},
        # the rate demo/watch.py re-plans pretraining's limit from: a busy 3-minute demo makes 20 steps or so
        "log": {"every": 2},
    })


def _curate() -> CurateConfig:
    # Gopher's "80% of words contain a letter" rule counts punctuation tokens as words and drops
    # about a third of Shakespeare's verse chunks (see docs/architecture.md); the demo keeps the rule but at
    # a threshold verse passes, and the report still shows what every filter removed per domain.
    return from_dict(CurateConfig, {"gopher_quality": {"min_alpha_words_ratio": 0.6}})


@dataclass
class ArenaDemoConfig:
    """The report card's arena: the demo's models answer held-out chat prompts, a judge picks the better
    answer of each pair (both orders), and `groundup arena` rates them (Bradley-Terry, as FastChat)."""

    enabled: bool = True  # false: no arena table
    prompts: int = 6  # held-out chat prompts per domain (math, code, text) every model answers
    battles_per_pair: int = 4  # battles each pair of models fights (each judged in both orders)
    max_tokens: int = 48  # longest answer, in tokens
    # the judge: "" = the demo's aligned model in this process, held to the verdict alone ([[A]]..[[D]]:
    # a model this small cannot write reasons and a verdict); or an OpenAI-compatible endpoint URL#model
    # (its key from OPENAI_API_KEY) or any groundup checkpoint, judging freely
    judge: str = ""
    bootstrap: int = 200  # bootstrap rounds of the rating intervals


@dataclass
class SampleConfig:
    max_new_tokens: int = 96  # tokens the base model generates per prompt (OUT/samples.json)
    temperature: float = 0.7  # sampling temperature; 0 = greedy
    top_k: int = 40  # sample from the k most likely tokens only; 0 = off
    seed: int = 0  # of the sampling
    # domain -> prompts the base model continues
    prompts: dict[str, list[str]] = field(default_factory=lambda: {
        "text": ["ROMEO.\nO, she doth teach the torches to burn bright!\n", "HAMLET.\nTo be, or not to be,",
                 "KING.\n"],
        "code": ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n", "class Stack:\n    def __init__(self):\n"],
        "math": ["Question: What is 17 + 25?\nSolution:", "Question: A box holds 12 pencils. How many pencils "
                 "are in 5 boxes?\nSolution:"],
    })


def _sft() -> SFTConfig:
    # Full fine-tuning (the model is small); replay: DemoConfig.replay_fraction.
    return from_dict(SFTConfig, {
        # 4 rows of 512 tokens (the 2,048 tokens a step of 16 x 128 had): a tool-use conversation fits a row
        "train": {"batch_size": 4, "seq_len": 512, "max_steps": 2000, "threads": -1},  # max_steps: a first guess
        "schedule": {"kind": "wsd", "peak_lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "decay_fraction": 0.3},
        "sft": {"eval_generations": 64, "eval_max_new_tokens": 48},  # scaled with the budget, as the scorecard
        "eval": {"every": 500},
        "checkpoint": {"every": 1000},
        "log": {"every": 10},
    })


def _grpo() -> GRPOConfig:
    return from_dict(GRPOConfig, {
        "train": {"max_steps": 400, "threads": -1},
        "schedule": {"kind": "constant", "peak_lr": 2e-5, "warmup_steps": 0},
        "grpo": {"rewards": ["exact_match"], "group_size": 8, "prompts_per_batch": 8, "max_new_tokens": 48,
                 "temperature": 1.0, "eval_count": 64,
                 "max_resample": 2,  # a step that draws 8 batches of samples overruns a short budget
                 # A short or busy demo's SFT model may answer no prompt right in GRPO's first steps (no group
                 # varies): it then learns nothing, which its reward curve shows, instead of stopping the demo.
                 "reward_patience": 0},
        "eval": {"every": 100},
        "checkpoint": {"every": 200},
        "log": {"every": 5},
    })


def _dpo() -> DPOConfig:
    return from_dict(DPOConfig, {
        "train": {"batch_size": 16, "seq_len": 128, "max_steps": 1000, "threads": -1},
        "schedule": {"kind": "wsd", "peak_lr": 1e-5, "min_lr": 1e-6, "warmup_steps": 5, "decay_fraction": 0.3},
        "dpo": {"beta": 0.1},
        "eval": {"every": 250},
        "checkpoint": {"every": 500},
        "log": {"every": 5},
    })


@dataclass
class PairsConfig:
    """`groundup data pairs` for DPO: the SFT model's own samples ranked by exact match."""

    prompts: int = 400  # held-in chat-math prompts sampled (at a 15-minute budget)
    samples: int = 4  # completions sampled per prompt (a pair needs two)
    temperature: float = 1.0  # sampling temperature
    max_new_tokens: int = 48  # longest sampled completion, in tokens


@dataclass
class BudgetShares:
    """How the training time is split (docs/demo-recipe.md: what each minute bought), once each training
    stage's few steps, the report-card rows, quantization and the report have what their measured cost
    needs (demo/budget.py)."""

    pretrain: float = 0.7  # relative weight of pretraining in the training time (the shares need not sum to 1)
    sft: float = 0.15  # relative weight of SFT
    align: float = 0.15  # relative weight of alignment (GRPO or DPO)

    def validate(self) -> None:
        for key in ("pretrain", "sft", "align"):
            if not getattr(self, key) > 0:
                fail(key, getattr(self, key), "a positive share")


@dataclass
class DemoConfig:
    budget_minutes: float = 15.0  # end to end, data and tokenizer included
    seed: int = 0  # of the generated math problems and conversations, and of the DPO pairs' sampling
    chunk_chars: int = 4000  # Shakespeare's plays and long modules split at paragraph breaks
    math_count: int = 20_000  # generated problems for pretraining
    chat_math_count: int = 20_000  # generated arithmetic conversations for SFT and alignment
    # Numbers within the 20 times table: arithmetic a model of this size can learn in minutes, so
    # SFT and alignment have something to improve (the generator goes up to 999 with 0).
    math_max_operand: int = 20
    # Tool-use conversations (arithmetic through the calculator or python) for SFT, as a share of
    # chat_math_count; the report card asks held-out arithmetic with the tools run for the model. 0 = none.
    tool_chat_share: float = 0.1
    # Share of every SFT batch drawn from the pretraining shards, so the base's held-out bits per
    # byte stay within a few percent (docs/demo-recipe.md).
    replay_fraction: float = 0.2
    limit_per_source: int = 0  # keep at most this many records per source (0: all; tests use a few)
    align: Literal["grpo", "dpo"] = "grpo"  # docs/demo-recipe.md: the one that gained more per minute here
    until: Literal["", "pretrain", "sft", "align"] = ""  # stop after this stage (and its report-card row)
    # A budget that cannot hold even a few steps of every training stage and every report-card row at
    # this machine's measured speed: "refuse" stops before pretraining and names the smallest budget
    # that works; "run" runs every stage for its few steps anyway, past the budget (demo/budget.py)
    short_budget: Literal["refuse", "run"] = "refuse"
    shares: BudgetShares = field(default_factory=BudgetShares)
    curate: CurateConfig = field(default_factory=_curate)
    # The tokenizer holds out the same documents (same fraction and seed) that become the
    # validation split, so validation bits-per-byte is measured on text the tokenizer never saw.
    # Held out: whole works of Shakespeare (every chunk and both editions of each), so the text figure
    # measures generalisation, not recall of the other edition of the same play. With seed 0 the
    # works whose hash falls under 0.15 are The Comedy of Errors, Henry VI Part 3, Timon of Athens
    # and The Phoenix and the Turtle (the report lists them).
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(
        vocab_size=4096, holdout_fraction=0.02, holdout_group=WORKS, holdout_group_fraction=0.15))
    tokenize: TokenizeConfig = field(default_factory=lambda: TokenizeConfig(
        val_fraction=0.02, split_group=WORKS, split_group_fraction=0.15))
    pretrain: TrainConfig = field(default_factory=_pretrain)
    sft: SFTConfig = field(default_factory=_sft)
    grpo: GRPOConfig = field(default_factory=_grpo)
    dpo: DPOConfig = field(default_factory=_dpo)
    pairs: PairsConfig = field(default_factory=PairsConfig)
    scorecard: ScorecardConfig = field(default_factory=ScorecardConfig)
    samples: SampleConfig = field(default_factory=SampleConfig)
    arena: ArenaDemoConfig = field(default_factory=ArenaDemoConfig)

    def validate(self) -> None:
        if self.budget_minutes <= 0:
            fail("budget_minutes", self.budget_minutes, "a positive number of minutes")
        if not 0 <= self.tool_chat_share <= 1:
            fail("tool_chat_share", self.tool_chat_share, "a share in [0, 1] (0 = no tool-use chats)")
        for key in ("chunk_chars", "math_count", "chat_math_count"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "a positive integer")
        if self.math_max_operand < 0:
            fail("math_max_operand", self.math_max_operand, "0 (the full ranges) or a positive bound")
        if (self.tokenizer.holdout_fraction, self.tokenizer.seed, self.tokenizer.holdout_group,
                self.tokenizer.holdout_group_fraction) != (self.tokenize.val_fraction, self.tokenize.seed,
                                                           self.tokenize.split_group, self.tokenize.split_group_fraction):
            fail("tokenizer.holdout_fraction", self.tokenizer.holdout_fraction,
                 f"tokenize.val_fraction ({self.tokenize.val_fraction}) with the same seed, so that the "
                 "tokenizer never trains on validation documents")
