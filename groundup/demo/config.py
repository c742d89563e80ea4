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

from groundup.config import fail, from_dict
from groundup.data.curate_config import CurateConfig
from groundup.tokens.shards import TokenizeConfig
from groundup.tokenizer.train import TokenizerConfig
from groundup.train.config import TrainConfig

# Every Shakespeare record names its `work`, the same for both editions and all chunks of a play.
WORKS = "work"

# The demo's model: sized for a 2-core CPU and a 15-minute budget (docs/demo-recipe.md).
# Small and fast wins at this budget: more tokens through a smaller model beat a wider or deeper one.
DEMO_MODEL = {"preset": "tiny", "d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "d_ff": 384,
              "max_seq_len": 128, "tie_embeddings": True}


def _pretrain() -> TrainConfig:
    return from_dict(TrainConfig, {
        "model": DEMO_MODEL,
        "train": {"batch_size": 32, "seq_len": 128, "max_steps": 1000},  # max_steps comes from the budget
        # Muon on the hidden matrices (AdamW on embeddings and norms), its update scaled to AdamW's
        # RMS so one peak rate drives both: 0.07 bits/byte better than AdamW at the same time.
        "optim": {"name": "muon", "weight_decay": 0.1, "grad_clip": 1.0},
        "schedule": {"kind": "cosine", "peak_lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 50},
        "precision": {"mode": "fp32"},
        "eval": {"max_batches": 8},
        "log": {"every": 10},
    })


def _curate() -> CurateConfig:
    # Gopher's "80% of words contain a letter" rule counts punctuation tokens as words and drops
    # about a third of Shakespeare's verse chunks (see docs/architecture.md); the demo keeps the rule but at
    # a threshold verse passes, and the report still shows what every filter removed per domain.
    return from_dict(CurateConfig, {"gopher_quality": {"min_alpha_words_ratio": 0.6}})


@dataclass
class SampleConfig:
    max_new_tokens: int = 96
    temperature: float = 0.7
    top_k: int = 40
    seed: int = 0
    prompts: dict[str, list[str]] = field(default_factory=lambda: {
        "text": ["ROMEO.\nO, she doth teach the torches to burn bright!\n", "HAMLET.\nTo be, or not to be,",
                 "KING.\n"],
        "code": ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n", "class Stack:\n    def __init__(self):\n"],
        "math": ["Question: What is 17 + 25?\nSolution:", "Question: A box holds 12 pencils. How many pencils "
                 "are in 5 boxes?\nSolution:"],
    })


@dataclass
class DemoConfig:
    budget_minutes: float = 15.0  # end to end, data and tokenizer included
    seed: int = 0
    chunk_chars: int = 4000  # Shakespeare's plays and long modules split at paragraph breaks
    math_count: int = 20_000  # generated problems
    limit_per_source: int = 0  # keep at most this many records per source (0: all; tests use a few)
    probe_steps: int = 8  # training steps timed to turn the budget into a step count
    reserve_seconds: float = 45.0  # kept for evaluation, samples and the report
    min_steps: int = 20
    evals: int = 5  # validation passes during training
    curate: CurateConfig = field(default_factory=_curate)
    # The tokenizer holds out the same documents (same fraction and seed) that become the
    # validation split, so validation bits-per-byte is measured on text the tokenizer never saw.
    # Held out: whole works of Shakespeare (every chunk and both editions of each), so the text figure
    # measures generalisation, not recall of the other edition of the same play.
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(
        vocab_size=4096, holdout_fraction=0.02, holdout_group=WORKS, holdout_group_fraction=0.1))
    tokenize: TokenizeConfig = field(default_factory=lambda: TokenizeConfig(
        val_fraction=0.02, split_group=WORKS, split_group_fraction=0.1))
    pretrain: TrainConfig = field(default_factory=_pretrain)
    samples: SampleConfig = field(default_factory=SampleConfig)

    def validate(self) -> None:
        if self.budget_minutes <= 0:
            fail("budget_minutes", self.budget_minutes, "a positive number of minutes")
        for key in ("probe_steps", "min_steps", "evals", "chunk_chars", "math_count"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "a positive integer")
        if (self.tokenizer.holdout_fraction, self.tokenizer.seed, self.tokenizer.holdout_group,
                self.tokenizer.holdout_group_fraction) != (self.tokenize.val_fraction, self.tokenize.seed,
                                                           self.tokenize.split_group, self.tokenize.split_group_fraction):
            fail("tokenizer.holdout_fraction", self.tokenizer.holdout_fraction,
                 f"tokenize.val_fraction ({self.tokenize.val_fraction}) with the same seed, so that the "
                 "tokenizer never trains on validation documents")
