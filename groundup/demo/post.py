"""The demo after pretraining: SFT, alignment, int8 quantization, and one report-card row per model.

    OUT/sft/                 groundup sft on OUT/chat (replay from OUT/tokens)      -> OUT/models/sft
    OUT/align/               groundup grpo on the arithmetic prompts, or            -> OUT/models/aligned
    OUT/pairs.jsonl + dpo    groundup data pairs from the SFT model, then groundup dpo
    OUT/models/aligned-int8  groundup quantize --method int8
    OUT/scorecard/NAME.json  demo/scorecard.py's row for each model

Each training stage gets its `train.time_limit_s` from demo/budget.py when it starts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from groundup.config import to_toml
from groundup.data.readers import ReadStats
from groundup.demo.scorecard import pick_chats, scaled, score_model
from groundup.io import atomic_write_json, read_json
from groundup.layout import SUMMARY_FILE
from groundup.model.model_dir import load_model_config
from groundup.posttrain.records import iter_examples
from groundup.tokenizer import load_tokenizer

CHAT_DOMAINS = ("math", "code", "text")
FULL_BUDGET_S = 15 * 60  # the scorecard's item counts are given for a 15-minute demo


class PostStages:
    def __init__(self, demo):
        self.demo, self.cfg, self.out = demo, demo.cfg, demo.out
        self.runner = demo.runner
        self.scale = min(1.0, self.cfg.budget_minutes * 60 / FULL_BUDGET_S)
        self._chats: dict | None = None
        self.rows_done = 0
        self.row_seconds: float | None = None
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

    def score(self, name: str, model: Path, native_math: bool = False, counted: bool = True) -> dict:
        """The report-card row of `model`; `counted`: one of the rows the budget plans for (the untrained
        model's row is scored before any plan, to measure what a row costs here)."""
        path = self.out / "scorecard" / f"{name}.json"

        def row() -> dict:
            found = score_model(model, tokens=self.out / "tokens", chats=self.chats(), cfg=self.cfg.scorecard,
                                scale=self.scale, native_math=native_math)
            path.parent.mkdir(exist_ok=True)
            atomic_write_json(path, {"name": name, **found})
            return {"seconds": found["seconds"]}

        result = self.runner.run(f"score_{name}", f"Report card: the {name} model", [to_toml(self.cfg.scorecard),
                                 self.scale], [path], row)
        self.rows_done += counted
        # The dearest row so far stands for the rows to come: later models write longer replies.
        self.row_seconds = max(self.row_seconds or 0.0, float(self.runner.state[f"score_{name}"]["seconds"]))
        self.last_model = model
        return result

    def served_model(self) -> Path:
        return self.last_model

    # ------------------------------------------------------------------ training stages

    def _plan(self, stage: str):
        plan = self.demo.budget.plan(stage, self.row_seconds, self.rows_done)
        self.demo.planned(stage, plan)
        return plan

    def _fresh(self, run: Path) -> None:
        if run.exists():  # the demo's own output of an interrupted or changed stage
            shutil.rmtree(run)

    def skipped(self, stage: str, plan, name: str, previous: str) -> bool:
        """When the budget left nothing for `stage`: OUT/models/NAME is a copy of the previous model and its
        row the previous row, both marked skipped, in a moment instead of an overrun."""
        if not (plan.spent and self.cfg.skip_spent_stages):
            return False
        o = self.out
        reason = (f"skipped: {plan.left:.0f} s of the budget left and {plan.reserved:.0f} s needed by what "
                  f"follows")

        def copy() -> dict:
            dest = o / "models" / name
            self._fresh(dest)
            shutil.copytree(o / "models" / previous, dest)
            return {"skipped": reason}

        self.runner.run(stage, f"{stage}: {reason}", [plan.left, plan.reserved], [o / "models" / name], copy)
        path = o / "scorecard" / f"{name}.json"

        def row() -> dict:
            found = read_json(o / "scorecard" / f"{previous}.json")
            atomic_write_json(path, {**found, "name": name, "model": str(o / "models" / name), "skipped": reason})
            return {"seconds": 0.0}

        self.runner.run(f"score_{name}", f"Report card: the {name} model (the {previous} model's row)", [reason],
                        [path], row)
        self.rows_done += 1
        self.last_model = o / "models" / name
        return True

    def sft(self) -> None:
        c, o = self.cfg, self.out
        plan = self._plan("sft")
        if self.skipped("sft", plan, "sft", "base"):
            return
        cfg = c.sft
        cfg.base = str(o / "models" / "base")
        cfg.sft.replay_shards = str(o / "tokens")
        cfg.sft.replay_fraction = c.replay_fraction
        cfg.sft.data = [str(o / "chat" / f"chat-{d}.jsonl") for d in CHAT_DOMAINS]
        cfg.sft.eval_data = [str(o / "chat" / "chat-math.heldout.jsonl")]
        cfg.sft.eval_generations = scaled(cfg.sft.eval_generations, self.scale)
        config = self.demo.config_file("sft", cfg)

        def run() -> dict:
            self._fresh(o / "sft")
            self.demo.verb("sft", "--config", config, "--out", o / "sft", "--quiet", f"train.time_limit_s={plan.seconds}")
            return _summary(o / "sft")

        self.runner.run("sft", f"Supervised fine-tuning for {plan.seconds:.0f} s", [to_toml(cfg), plan.seconds],
                        [o / "sft"], run)
        self.runner.run("export_sft", "SFT model -> OUT/models/sft", [], [o / "models" / "sft"],
                        lambda: str(self.demo.export(o / "sft", "sft")))
        self.score("sft", o / "models" / "sft")

    def align(self) -> None:
        c, o = self.cfg, self.out
        plan = self._plan("align")
        if self.skipped("align", plan, "aligned", "sft"):
            return
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
