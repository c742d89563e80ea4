"""The demo after pretraining: SFT, alignment, int8 quantization, and one report-card row per model.

    OUT/sft/                 groundup sft on OUT/chat (replay from OUT/tokens)      -> OUT/models/sft
    OUT/align/               groundup grpo on the arithmetic prompts, or            -> OUT/models/aligned
    OUT/pairs.jsonl + dpo    groundup data pairs from the SFT model, then groundup dpo
    OUT/models/aligned-int8  groundup quantize --method int8
    OUT/scorecard/NAME.json  demo/scorecard.py's row for each model

Each training stage gets its `train.time_limit_s` from demo/budget.py when it starts, from the costs
measured so far (demo/costs.py; every row measured updates them). SFT and alignment always run, and
alignment only on the SFT model.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from groundup.config import to_toml
from groundup.data.readers import ReadStats
from groundup.demo.budget import budget_scale
from groundup.demo.costs import Costs
from groundup.demo.scorecard import pick_chats, scaled, score_model
from groundup.errors import GroundupError
from groundup.io import atomic_write_json, read_json
from groundup.layout import SUMMARY_FILE
from groundup.model.model_dir import load_model_config
from groundup.posttrain.records import iter_examples
from groundup.tokenizer import load_tokenizer

CHAT_DOMAINS = ("math", "code", "text")


class PostStages:
    def __init__(self, demo):
        self.demo, self.cfg, self.out = demo, demo.cfg, demo.out
        self.runner = demo.runner
        self.scale = budget_scale(self.cfg.budget_minutes)
        self._chats: dict | None = None
        self._tool_chats: list | None = None
        self.costs: Costs | None = None  # set once the machine and the untrained model's row are measured
        self.limits: dict[str, float] = {}  # each training stage's final time limit
        self.last_model = self.out / "models" / "base"

    # ------------------------------------------------------------------ the report card's rows

    def chats(self) -> dict:
        """The held-out conversations every model answers (the same for every row)."""
        if self._chats is None:
            chat = self.out / "chat"
            found = {d: list(iter_examples([chat / f"chat-{d}.heldout.jsonl"], ReadStats(), []))
                     for d in CHAT_DOMAINS if (chat / f"chat-{d}.heldout.jsonl").is_file()}
            first = self.out / "models" / "untrained"  # every model of the demo has its tokenizer and context
            self._chats = pick_chats(found, self.cfg.scorecard, self.scale, load_tokenizer(first / "tokenizer"),
                                     load_model_config(first).max_seq_len)
        return self._chats

    def tool_chats(self) -> list:
        """The held-out arithmetic every model answers with tools (none when the demo made no tool chats):
        those whose whole conversation fits the models' context."""
        if self._tool_chats is None:
            held = self.out / "chat-tools" / "chat-tools-math.heldout.jsonl"
            first = self.out / "models" / "untrained"
            n = scaled(self.cfg.scorecard.tool_problems, self.scale) if self.cfg.scorecard.tool_problems else 0
            self._tool_chats = []
            if n and held.is_file():
                tok, context = load_tokenizer(first / "tokenizer"), load_model_config(first).max_seq_len
                for ex in iter_examples([held], ReadStats(), []):
                    if len(self._tool_chats) == n:
                        break
                    if len(tok.render_chat(ex.messages, tools=ex.tools)[0]) <= context:
                        self._tool_chats.append(ex)
        return self._tool_chats

    def score(self, name: str, model: Path, native_math: bool = False) -> dict:
        """The report-card row of `model` (OUT/scorecard/NAME.json); a dearer row than any before raises the
        price of the rows still to come."""
        path = self.out / "scorecard" / f"{name}.json"

        def row() -> dict:
            found = score_model(model, tokens=self.out / "tokens", chats=self.chats(), cfg=self.cfg.scorecard,
                                scale=self.scale, native_math=native_math, tool_chats=self.tool_chats())
            path.parent.mkdir(exist_ok=True)
            atomic_write_json(path, {"name": name, **found})
            return {"seconds": found["seconds"]}

        result = self.runner.run(f"score_{name}", f"Report card: the {name} model", [to_toml(self.cfg.scorecard),
                                 self.scale], [path], row)
        if self.costs is not None:
            self.costs = self.costs.with_row(read_json(path))
        self.last_model = model
        return result

    def served_model(self) -> Path:
        return self.last_model

    # ------------------------------------------------------------------ training stages

    def _plan(self, stage: str):
        plan = self.demo.budget.plan(stage, self._measured())
        self.demo.planned(plan)
        if plan.short:
            print(f"[{stage}] the budget left ({plan.left:.0f} s) is less than what follows needs at the least "
                  f"({plan.reserved:.0f} s): {stage} runs its few steps ({plan.seconds:.0f} s) anyway", file=sys.stderr)
        return plan

    def _measured(self) -> Costs:
        """The costs with how far past its limit each training stage so far ran."""
        times = self.runner.times()
        over = [times[s] - limit for s, limit in self.limits.items() if s in times]
        return self.costs.replace(overrun_s=max(0.0, *over)) if over else self.costs

    def _fresh(self, run: Path) -> None:
        if run.exists():  # the demo's own output of an interrupted or changed stage
            shutil.rmtree(run)

    def sft(self) -> None:
        c, o = self.cfg, self.out
        plan = self._plan("sft")
        cfg = c.sft
        cfg.base = str(o / "models" / "base")
        cfg.sft.replay_shards = str(o / "tokens")
        cfg.sft.replay_fraction = c.replay_fraction
        cfg.sft.data = [str(o / "chat" / f"chat-{d}.jsonl") for d in CHAT_DOMAINS]
        if (o / "chat-tools" / "chat-tools-math.jsonl").is_file():  # arithmetic through the calculator
            cfg.sft.data.append(str(o / "chat-tools" / "chat-tools-math.jsonl"))
        cfg.sft.eval_data = [str(o / "chat" / "chat-math.heldout.jsonl")]
        cfg.sft.eval_generations = scaled(cfg.sft.eval_generations, self.scale)
        config = self.demo.config_file("sft", cfg)

        def run() -> dict:
            self._fresh(o / "sft")
            self.demo.verb("sft", "--config", config, "--out", o / "sft", "--quiet", f"train.time_limit_s={plan.seconds}")
            return _summary(o / "sft")

        result = self.runner.run("sft", f"Supervised fine-tuning for {plan.seconds:.0f} s", [to_toml(cfg),
                                 plan.seconds], [o / "sft"], run)
        self.limits["sft"] = plan.seconds
        if not (result or {}).get("steps"):
            raise GroundupError(f"{o / 'sft'}: SFT made no step; the demo stops rather than align a model that "
                                "has not had SFT")
        self.runner.run("export_sft", "SFT model -> OUT/models/sft", [], [o / "models" / "sft"],
                        lambda: str(self.demo.export(o / "sft", "sft")))
        self.score("sft", o / "models" / "sft")

    def align(self) -> None:
        c, o = self.cfg, self.out
        sft = self.runner.state.get("sft", {})
        if sft.get("status") != "done" or not (sft.get("result") or {}).get("steps") or \
                not (o / "models" / "sft").is_dir():
            raise GroundupError(f"{o}: alignment runs on the SFT model only, and no SFT stage finished here")
        plan = self._plan("align")
        if c.align == "grpo":
            cfg = c.grpo
            cfg.base = str(o / "models" / "sft")
            cfg.grpo.prompts = [str(o / "chat" / "chat-math.jsonl")]
            cfg.grpo.eval_prompts = [str(o / "chat" / "chat-math.heldout.jsonl")]
            cfg.grpo.eval_count = scaled(cfg.grpo.eval_count, self.scale)
            config = self.demo.config_file("grpo", cfg)

            def run() -> dict:
                self._fresh(o / "align")
                self.demo.verb("grpo", "--config", config, "--out", o / "align", "--quiet",
                               f"train.time_limit_s={plan.seconds}")
                return _summary(o / "align")
        else:
            cfg = c.dpo
            cfg.base = str(o / "models" / "sft")
            cfg.dpo.data = [str(o / "pairs.jsonl")]
            cfg.dpo.eval_data = [str(o / "pairs-heldout.jsonl")]
            config = self.demo.config_file("dpo", cfg)

            def run() -> dict:
                import time

                self._fresh(o / "align")
                started = time.perf_counter()
                self._pairs()
                left = plan.seconds - (time.perf_counter() - started)
                self.demo.verb("dpo", "--config", config, "--out", o / "align", "--quiet",
                               f"train.time_limit_s={max(2.0, round(left, 1))}")
                return _summary(o / "align")

        self.runner.run("align", f"Alignment ({c.align}) for {plan.seconds:.0f} s", [c.align, to_toml(cfg),
                        to_toml(c.pairs), plan.seconds], [o / "align"], run)
        self.limits["align"] = plan.seconds
        self.runner.run("export_aligned", "Aligned model -> OUT/models/aligned", [], [o / "models" / "aligned"],
                        lambda: str(self.demo.export(o / "align", "aligned")))
        self.score("aligned", o / "models" / "aligned")

    def _pairs(self) -> None:
        """Pairs from the SFT model's own samples, ranked by exact match: training and held-out prompts apart."""
        p, o = self.cfg.pairs, self.out
        common = ["--model", o / "models" / "sft", "--reward", "exact_match", "--samples", p.samples,
                  "--temperature", p.temperature, "--max-new-tokens", p.max_new_tokens, "--seed", self.cfg.seed,
                  "--overwrite"]
        self.demo.verb("data", "pairs", "--prompts", o / "chat" / "chat-math.jsonl", "--out", o / "pairs.jsonl",
                       "--limit", scaled(p.prompts, self.scale), *common)
        self.demo.verb("data", "pairs", "--prompts", o / "chat" / "chat-math.heldout.jsonl", "--out",
                       o / "pairs-heldout.jsonl", "--limit", scaled(p.prompts // 4, self.scale), *common)

    def quantize(self) -> None:
        o = self.out
        dest = o / "models" / "aligned-int8"

        def run() -> str:
            self._fresh(dest)
            self.demo.verb("quantize", "--model", o / "models" / "aligned", "--method", "int8", "--out", dest)
            return str(dest)

        self.runner.run("quantize", "int8 weight-only quantization", [], [dest], run)
        self.score("aligned-int8", dest)


def _summary(run: Path) -> dict:
    s = read_json(run / SUMMARY_FILE)
    return {k: s.get(k) for k in ("steps", "max_steps", "tokens", "train_loss", "val_loss", "wall_time_s", "replans",
                                  "time_limit_reached", "eval")}
