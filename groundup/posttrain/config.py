"""Post-training configs: the training core's sections, the base model and LoRA, plus the verb's own.

    cfg = load_config(SFTConfig, "sft.toml", ["sft.loss_on=completion", "lora.rank=16"])

Composed, not inherited from pretraining's TrainConfig: the model is the base's (`base`), so there is no
[model] section, and no token shards but SFT's replay (`sft.replay_shards`); a key that does not apply
to a verb fails at once with a did-you-mean. `train.seq_len = 0` (the default) is the base model's
context. Defaults are those of fine-tuning, not pretraining: a short warmup, a small peak rate.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from groundup.config import fail
from groundup.model.lora import LoraConfig
from groundup.tools import resolve_tools
from groundup.train.config import (INCOMPATIBLE, CheckpointConfig, DistributedConfig, EvalConfig, LogConfig,
                                   LoopConfig, OptimConfig, PrecisionConfig, ScheduleConfig, StabilityConfig,
                                   StepsConfig)


def _sft_schedule() -> ScheduleConfig:
    return ScheduleConfig(kind="cosine", peak_lr=1e-4, min_lr=1e-5, warmup_steps=20, warmup_max_fraction=0.05)


@dataclass
class PostTrainLoopConfig(LoopConfig):
    max_steps: int = 0  # optimizer steps; 0 = derived from the stage's epochs
    seq_len: int = 0  # tokens per row; 0 = the base model's context

    steps_from_epochs = True
    min_seq_len = 0


@dataclass
class RolloutLoopConfig(StepsConfig):
    """GRPO's loop: a micro-batch is grpo.prompts_per_batch x grpo.group_size sampled rows, whose length is
    the prompt's plus grpo.max_new_tokens, so it has no batch_size or seq_len of its own."""

    max_steps: int = 0  # optimizer steps (required: GRPO runs for steps, not epochs)

    steps_from_epochs = True


@dataclass
class SFTDataConfig:
    data: list[str] = field(default_factory=list)  # JSONL/Parquet files or directories (--data)
    eval_data: list[str] = field(default_factory=list)  # held-out files; none: records marked split="heldout"
    replay_shards: str = ""  # pretraining token shards (`data tokenize` output) that replay_fraction draws from
    val_fraction: float = 0.02  # share held out when no record says its split (by a hash of the record)
    loss_on: Literal["assistant", "completion", "all"] = "assistant"  # which tokens are trained
    packing: bool = True  # several examples per row (no attention across them); false: pad to the longest
    epochs: float = 1.0  # passes over the training examples; train.max_steps = 0 derives the steps from it
    replay_fraction: float = 0.0  # share of each batch drawn from replay_shards; 0 = off
    eval_generations: int = 32  # held-out conversations answered greedily at each evaluation (0 = none)
    eval_max_new_tokens: int = 128  # longest greedy reply to a held-out conversation, in tokens
    seed: int = 0  # of the held-out split and the example order

    def validate(self) -> None:
        if not 0 <= self.val_fraction < 1:
            fail("val_fraction", self.val_fraction, "a number in [0, 1)")
        if not 0 <= self.replay_fraction < 1:
            fail("replay_fraction", self.replay_fraction, "a number in [0, 1) (0 = no replay)")
        if self.epochs <= 0:
            fail("epochs", self.epochs, "a positive number")
        for key in ("eval_generations", "eval_max_new_tokens"):
            if getattr(self, key) < 0:
                fail(key, getattr(self, key), "an integer >= 0")


@dataclass
class PostTrainConfig:
    """What every post-training verb shares: the base model, the training core's sections, LoRA."""

    base: str = ""  # the model to train: a model directory, run directory, imported HF/GGUF model (--model)
    train: PostTrainLoopConfig = field(default_factory=PostTrainLoopConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=_sft_schedule)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    incompatible_keys: ClassVar[tuple[str, ...]] = INCOMPATIBLE + ("lora.", "base")
    # Sections a pretraining config has and this one has not, with why (the unknown-key error says so).
    moved_keys: ClassVar[dict[str, str]] = {
        "model": "post-training trains the base model as it is (--model / base); its config is the base's",
        "data": "post-training reads its own data files (the verb's --data or --prompts); SFT's replay shards "
                "are sft.replay_shards",
    }

    @classmethod
    def upgrade_saved(cls, data: dict) -> dict:
        """A run directory written before post-training configs were composed: its [model] section was the
        base's, [data] held SFT's replay shards, and pretraining's keys sat in [train], [eval], [stability]."""
        data.pop("model", None)
        shards = (data.pop("data", None) or {}).get("shards")
        hints = typing.get_type_hints(cls)
        if shards and "sft" in hints:
            data.setdefault("sft", {}).setdefault("replay_shards", shards)
        for section in ("train", "eval", "stability"):
            known = {f.name for f in dataclasses.fields(hints[section])}
            for key in [k for k in data.get(section, {}) if k not in known]:
                del data[section][key]
        return data

    def validate(self) -> None:
        if self.lora.enabled and self.distributed.strategy != "ddp":
            fail("distributed.strategy", self.distributed.strategy, "'ddp' with LoRA (the adapters are small; the base stays whole)")


@dataclass
class SFTConfig(PostTrainConfig):
    sft: SFTDataConfig = field(default_factory=SFTDataConfig)

    verb: ClassVar[str] = "sft"
    incompatible_keys: ClassVar[tuple[str, ...]] = PostTrainConfig.incompatible_keys + (
        "sft.loss_on", "sft.packing", "sft.seed")

    def validate(self) -> None:
        super().validate()
        if self.sft.replay_fraction and not self.sft.replay_shards:
            fail("sft.replay_fraction", self.sft.replay_fraction, "0 unless sft.replay_shards names pretraining shards")


@dataclass
class PreferenceDataConfig:
    data: list[str] = field(default_factory=list)  # JSONL/Parquet files (--data)
    eval_data: list[str] = field(default_factory=list)  # held-out files; none: records marked split="heldout"
    val_fraction: float = 0.05  # share held out when no record says its split (by a hash of the prompt)
    epochs: float = 1.0  # passes over the data; train.max_steps = 0 derives the steps from it
    beta: float = 0.1  # strength of the pull toward the reference model
    seed: int = 0  # of the held-out split and the example order

    def validate(self) -> None:
        if not 0 <= self.val_fraction < 1:
            fail("val_fraction", self.val_fraction, "a number in [0, 1)")
        if self.epochs <= 0:
            fail("epochs", self.epochs, "a positive number")
        if self.beta <= 0:
            fail("beta", self.beta, "a positive number")


@dataclass
class DPOSection(PreferenceDataConfig):
    loss: Literal["sigmoid", "ipo", "hinge"] = "sigmoid"  # sigmoid: DPO's own; ipo: IPO's squared loss; hinge: SLiC's
    label_smoothing: float = 0.0  # sigmoid only: the assumed share of flipped labels (conservative DPO)
    # Weight of the chosen completions' negative log-likelihood added to the loss (RPO; TRL's
    # loss_type=[loss, "sft"] with loss_weights=[1, sft_weight]): keeps the chosen replies likely while
    # the margin grows. 0: plain DPO.
    sft_weight: float = 0.0

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.label_smoothing < 0.5:
            fail("label_smoothing", self.label_smoothing, "a number in [0, 0.5)")
        if not self.sft_weight >= 0:
            fail("sft_weight", self.sft_weight, "a weight >= 0")


@dataclass
class RMSection(PreferenceDataConfig):
    # Weight of an auxiliary language-modelling loss: the chosen completions' negative log-likelihood per
    # token, through the same trunk (the verifiers of Cobbe et al. 2021; "SFT regularisation" in Yang et
    # al. 2024's GRM). It keeps the token-level knowledge a verifier needs from being overwritten by a
    # head fitted to a few thousand pairs. 0: the Bradley-Terry loss alone (TRL's RewardTrainer).
    lm_weight: float = 0.0

    def validate(self) -> None:
        super().validate()
        if not self.lm_weight >= 0:
            fail("lm_weight", self.lm_weight, "a weight >= 0")


@dataclass
class KTOSection(PreferenceDataConfig):
    desirable_weight: float = 1.0  # λ_D: weight of desirable examples' losses (> 0)
    undesirable_weight: float = 1.0  # λ_U: weight of undesirable examples' (> 0)

    def validate(self) -> None:
        super().validate()
        for key in ("desirable_weight", "undesirable_weight"):  # a negative weight turns learning into unlearning
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                fail(key, value, "a positive weight (KTO's λ_D and λ_U; the paper keeps λ_D n_D / λ_U n_U in "
                                 "[1, 4/3])")


def _preference_schedule() -> ScheduleConfig:
    return ScheduleConfig(kind="cosine", peak_lr=5e-6, min_lr=5e-7, warmup_steps=10, warmup_max_fraction=0.1)


@dataclass
class DPOConfig(PostTrainConfig):
    schedule: ScheduleConfig = field(default_factory=_preference_schedule)
    dpo: DPOSection = field(default_factory=DPOSection)

    verb: ClassVar[str] = "dpo"
    incompatible_keys: ClassVar[tuple[str, ...]] = PostTrainConfig.incompatible_keys + ("dpo.loss", "dpo.seed")


@dataclass
class KTOConfig(PostTrainConfig):
    schedule: ScheduleConfig = field(default_factory=_preference_schedule)
    kto: KTOSection = field(default_factory=KTOSection)

    verb: ClassVar[str] = "kto"
    incompatible_keys: ClassVar[tuple[str, ...]] = PostTrainConfig.incompatible_keys + ("kto.seed",)


@dataclass
class GRPOSection:
    prompts: list[str] = field(default_factory=list)  # JSONL/Parquet: prompt (text or messages) or messages + fields
    eval_prompts: list[str] = field(default_factory=list)  # held-out prompts; none: split="heldout" records
    rewards: list[str] = field(default_factory=lambda: ["exact_match"])  # shipped names or module:function
    reward_weights: list[float] = field(default_factory=list)  # one per reward; empty: all 1
    group_size: int = 8  # G completions sampled per prompt
    prompts_per_batch: int = 4  # prompts per micro-batch (a micro-batch holds prompts_per_batch x G sequences)
    iterations: int = 1  # optimisation passes per batch of samples (TRL's num_iterations, GRPO's mu)
    max_new_tokens: int = 64  # longest sampled completion, in tokens (also for the greedy evaluation)
    temperature: float = 1.0  # sampling temperature (log-probabilities are taken at it too); 0 = greedy
    top_p: float = 1.0  # nucleus sampling: keep the smallest set of tokens with this probability; 1 = off
    epsilon: float = 0.2  # clip range of the probability ratio (low side)
    epsilon_high: float = 0.0  # high side; 0: = epsilon (DAPO uses 0.28)
    beta: float = 0.0  # weight of the k3 KL to the reference; 0 = no reference model at all
    scale_rewards: bool = True  # divide advantages by the group's standard deviation; false = Dr. GRPO
    loss_aggregation: Literal["sequence", "token", "dr_grpo"] = "sequence"  # GRPO; DAPO's per token; Dr. GRPO's
    max_resample: int = 8  # batches drawn again when every group's rewards are all equal (nothing to learn)
    # steps after which a run stops with an error when a reward failed on every call in each of them, or
    # when no step since the start had a group whose rewards differed (nothing to learn); 0 = never stop
    reward_patience: int = 5
    # completions cut off at max_new_tokens score and count in their group's advantages but get no gradient
    # (TRL's mask_truncated_completions, DAPO's overlong filtering): what a reply says after its answer while
    # never ending its turn is not reinforced
    mask_truncated: bool = False
    # a chat reply that ends with the document-end token instead of the end of turn is malformed (the format
    # drift of GRPO on chat prompts): it scores this much below the lowest reward of its group, so it is
    # pushed down, its end token included; 0 = scored like any other reply
    malformed_penalty: float = 1.0
    tools: str = ""  # tools the policy may call while it replies (e.g. "calculator,python"; chat prompts); "" = none
    max_tool_calls: int = 4  # tool calls in one reply, at most (with tools)
    eval_count: int = 64  # held-out prompts answered greedily at each evaluation
    seed: int = 0  # of the prompt order and the sampling

    def validate(self) -> None:
        if not (self.malformed_penalty >= 0 and math.isfinite(self.malformed_penalty)):
            fail("malformed_penalty", self.malformed_penalty, "a number >= 0 (0 = no penalty)")
        check_tools_spec(self.tools, self.max_tool_calls)
        for key in ("group_size", "prompts_per_batch", "iterations", "max_new_tokens", "max_resample"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "a positive integer")
        if self.group_size < 2:
            fail("group_size", self.group_size, "at least 2 (advantages compare completions of one prompt)")
        if not 0 < self.epsilon < 1 or not 0 <= self.epsilon_high < 10:
            fail("epsilon", self.epsilon, "a number in (0, 1) (and epsilon_high in [0, 10))")
        if not self.beta >= 0:
            fail("beta", self.beta, "a weight >= 0 (0 = no KL term)")
        if not self.temperature >= 0:
            fail("temperature", self.temperature, "a temperature >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            fail("top_p", self.top_p, "a probability in (0, 1] (1 = off)")
        if self.reward_patience < 0:
            fail("reward_patience", self.reward_patience, "an integer >= 0 (0 = never stop)")


def check_tools_spec(tools: str, max_tool_calls: int) -> None:
    """GRPO's and RFT's tools: a spec resolve_tools reads (each name resolved now: a typo fails before the
    model loads), and a positive call budget."""
    if max_tool_calls < 1:
        fail("max_tool_calls", max_tool_calls, "a positive integer")
    resolve_tools(tools)  # a ConfigError on `tools` naming what is wrong (an unknown name: did you mean)


def _rl_schedule() -> ScheduleConfig:
    return ScheduleConfig(kind="constant", peak_lr=1e-5, min_lr=0.0, warmup_steps=0)


@dataclass
class GRPOConfig(PostTrainConfig):
    train: RolloutLoopConfig = field(default_factory=RolloutLoopConfig)
    schedule: ScheduleConfig = field(default_factory=_rl_schedule)
    grpo: GRPOSection = field(default_factory=GRPOSection)

    verb: ClassVar[str] = "grpo"
    incompatible_keys: ClassVar[tuple[str, ...]] = PostTrainConfig.incompatible_keys + (
        "grpo.group_size", "grpo.prompts_per_batch", "grpo.seed")

    def validate(self) -> None:
        super().validate()
        if self.distributed.strategy != "ddp":
            fail("distributed.strategy", self.distributed.strategy, "'ddp' for GRPO (sampling needs the whole model on each process)")


@dataclass
class PRMSection:
    """A process reward model (`rm --process`): rm.data holds prompts with an `answer` (their steps are
    labelled as Math-Shepherd does) or records already labelled (`steps` and `labels`)."""

    enabled: bool = False  # true (--process): score each step's end, trained on step labels; false: pairs
    split: str = "lines"  # how a solution splits into steps: "lines", "sentences", or a marker ending each step
    solutions: int = 4  # solutions sampled from the policy per prompt, whose steps are labelled
    completions: int = 8  # completions sampled from each step's prefix (Math-Shepherd's N)
    estimation: Literal["hard", "soft"] = "hard"  # hard: 1 if any completion reaches the answer; soft: the share
    correct: str = "exact_match"  # the reward saying a finished solution reaches the answer (above 0 = right)
    policy: str = ""  # the model that samples solutions and completions; "" = the base (--model)
    max_new_tokens: int = 64  # longest sampled solution or completion, in tokens
    temperature: float = 1.0  # sampling temperature of solutions and completions (> 0: N samples must differ)
    batch_rows: int = 32  # completions sampled together (larger on a GPU)
    chunk: int = 16  # prompts labelled between saves of the work done (a kill loses at most one chunk)

    def validate(self) -> None:
        for key in ("solutions", "completions", "max_new_tokens", "batch_rows", "chunk"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "a positive integer")
        if not self.split:
            fail("split", self.split, "'lines', 'sentences' or a non-empty step marker")
        if not self.temperature > 0:
            fail("temperature", self.temperature, "a temperature > 0 (greedy completions of a step are all alike)")


@dataclass
class RMConfig(PostTrainConfig):
    schedule: ScheduleConfig = field(default_factory=_sft_schedule)
    rm: RMSection = field(default_factory=RMSection)  # beta is unused here
    prm: PRMSection = field(default_factory=PRMSection)  # a process reward model (--process); off by default

    verb: ClassVar[str] = "rm"
    incompatible_keys: ClassVar[tuple[str, ...]] = PostTrainConfig.incompatible_keys + (
        "rm.seed", "prm.enabled", "prm.split")

    def validate(self) -> None:
        super().validate()
        if self.lora.enabled:
            fail("lora.rank", self.lora.rank, "0 for a reward model (its value head trains and is saved whole)")


@dataclass
class RFTSection:
    prompts: list[str] = field(default_factory=list)  # prompt records (as GRPO's)
    eval_prompts: list[str] = field(default_factory=list)  # held-out prompts; none: split="heldout" records
    rewards: list[str] = field(default_factory=lambda: ["exact_match"])  # shipped names or module:function
    reward_weights: list[float] = field(default_factory=list)  # one per reward; empty: all 1
    samples: int = 8  # k completions sampled per prompt
    threshold: float | None = None  # keep every sample scoring at least this; none: the best per prompt
    rounds: int = 1  # sample -> keep -> fine-tune, repeated from the last round's model
    max_new_tokens: int = 64  # longest sampled completion, in tokens (also for the greedy evaluation)
    temperature: float = 1.0  # sampling temperature; 0 = greedy
    eval_count: int = 64  # held-out prompts answered greedily before and after each round
    seed: int = 0  # of the sampling; round n samples with seed + n
    # sampling batches (32 completions) after which a round stops with an error when a reward failed on
    # every call in each of them, or when every prompt's samples scored alike in each since the round
    # began; 0 = never stop
    reward_patience: int = 20
    tools: str = ""  # tools the model may call while it replies (e.g. "calculator,python"; chat prompts); "" = none
    max_tool_calls: int = 4  # tool calls in one reply, at most (with tools)

    def validate(self) -> None:
        check_tools_spec(self.tools, self.max_tool_calls)
        for key in ("samples", "rounds", "max_new_tokens"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "a positive integer")
        if self.reward_patience < 0:
            fail("reward_patience", self.reward_patience, "an integer >= 0 (0 = never stop)")
        if self.temperature < 0:
            fail("temperature", self.temperature, "a temperature >= 0 (0 = greedy)")


@dataclass
class RFTConfig(SFTConfig):
    rft: RFTSection = field(default_factory=RFTSection)

    verb: ClassVar[str] = "rft"
