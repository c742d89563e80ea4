"""`groundup demo`: the whole chain on the embedded corpus, within a time budget, then a report card.

    OUT/raw/            the embedded corpus as JSONL                        (groundup data sample)
    OUT/chat/           conversations for fine-tuning, held-out files apart (groundup data sample --chat)
    OUT/chat-tools/     arithmetic through the calculator or python         (groundup data sample --chat --tools)
    OUT/curated/        filtered, deduplicated, mixed shards                (groundup data curate)
    OUT/tokenizer/      byte-level BPE                                      (groundup tokenizer train)
    OUT/tokens/         token shards; whole Shakespeare works held out      (groundup data tokenize)
    OUT/measure         this machine's speed now: a training step, a float and an int8 forward (demo/measure.py)
    OUT/run/            pretraining, fitted to its share of the budget      (groundup train)
    OUT/sft/            supervised fine-tuning on the chat data             (groundup sft)
    OUT/align/          GRPO on arithmetic (or DPO on sampled pairs)        (groundup grpo / data pairs + dpo)
    OUT/models/         base, sft, aligned, aligned-int8: model directories (groundup quantize for the last)
    OUT/scorecard/      one JSON row per model: the report card's table
    OUT/samples.json    the base model's completions of a few prompts per domain
    OUT/report.md       the report card, with OUT/plots/*.png               (groundup report OUT)

Each stage runs the stage's own CLI verb on a config file the demo writes to OUT/configs/, so the
exact commands are in OUT/commands.sh and each stage can be rerun by hand. How the budget is split
between the stages: demo/budget.py; what is measured for it: demo/costs.py; how pretraining's limit
follows the load while it runs: demo/watch.py (OUT/pretrain_limit.json is its train.time_limit_file).
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import sys
import time
from pathlib import Path

from groundup.cli import main as cli
from groundup.config import save_config, to_toml
from groundup.demo.budget import DemoBudget
from groundup.demo.config import DemoConfig
from groundup.demo.costs import Costs
from groundup.demo.arena_stage import arena_arguments, write_prompts
from groundup.demo.measure import measure_machine, train_step_seconds
from groundup.demo.post import PostStages
from groundup.demo.stages import StageRunner, banner
from groundup.demo.watch import PretrainWatch
from groundup.errors import GroundupError
from groundup.infer import Generator
from groundup.io import atomic_write_json, atomic_write_text, read_json
from groundup.layout import (MODEL_CONFIG_FILE, SUMMARY_FILE, TOKENIZER_DIR, WEIGHTS_FILE, claim_output_dir,
                             find_tokenizer_dir, resolve_model_dir)
from groundup.model import Transformer
from groundup.model.model_dir import save_model
from groundup.report import write_report
from groundup.tokenizer import load_tokenizer
from groundup.train.threads import fastest_threads
from groundup.train.time_budget import write_time_limit

LIMIT_FILE = "pretrain_limit.json"  # pretraining's train.time_limit_file, moved by demo/watch.py


class Demo:
    def __init__(self, cfg: DemoConfig, out: Path, fresh: bool = False):
        self.cfg, self.out = cfg, claim_output_dir(out, "demo", mark=True)
        self.runner = StageRunner(self.out, fresh=fresh)
        self.runner.prepare = self._threads
        self.budget = DemoBudget(cfg, self.runner)
        self.commands: list[str] = []
        self.plans: dict[str, dict] = {}
        (self.out / "configs").mkdir(exist_ok=True)
        save_config(cfg, self.out / "configs" / "demo.toml")

    # ------------------------------------------------------------------ helpers

    def verb(self, *args) -> None:
        """Run one `groundup` verb in this process; a non-zero exit stops the demo."""
        words = [str(a) for a in args]
        self.commands.append("groundup " + " ".join(shlex.quote(w) for w in words))
        code = cli(words)
        if code:
            raise GroundupError(f"stage command failed (exit {code}): groundup {' '.join(words)}")

    def config_file(self, name: str, cfg) -> Path:
        path = self.out / "configs" / f"{name}.toml"
        save_config(cfg, path)
        return path

    def export(self, source: Path, name: str) -> Path:
        """The newest checkpoint of run `source` as the model directory OUT/models/NAME (weights, config, tokenizer)."""

        model = resolve_model_dir(source)
        dest = self.out / "models" / name
        tmp = dest.with_name(f".{name}.tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for file in (WEIGHTS_FILE, MODEL_CONFIG_FILE):
            shutil.copy2(model / file, tmp / file)
        shutil.copytree(find_tokenizer_dir(model), tmp / TOKENIZER_DIR)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
        print(f"{dest}: weights of {model}", file=sys.stderr)
        return dest

    def _threads(self) -> dict:
        """Before each stage: the thread count that runs fastest now (demo/threads.py)."""
        best, timings = fastest_threads(self.cfg.pretrain.model.d_model)
        print(f"threads: {best} (matmul round: " + ", ".join(f"{n} -> {1e3 * t:.1f} ms" for n, t in timings.items())
              + ")", file=sys.stderr)
        return {"threads": best}

    def planned(self, plan) -> None:
        self.plans[plan.stage] = plan.to_dict()

    # ------------------------------------------------------------------ stages

    def run(self) -> Path:
        c, o = self.cfg, self.out
        if not self.runner.state and c.short_budget == "refuse":
            self._early_check()
        self.data_stages()
        post = PostStages(self)
        self.runner.run("untrained", "Untrained model -> OUT/models/untrained", to_toml(c.pretrain.model),
                        [o / "models" / "untrained"], self._untrained)
        t = c.pretrain.train
        machine = self.runner.run("measure", "Measure this machine now: a training step, float and int8 forwards",
                                  [t.batch_size, t.seq_len], [], lambda: measure_machine(o / "models" / "untrained",
                                                                                         t.batch_size, t.seq_len))
        post.score("untrained", o / "models" / "untrained")
        post.costs = Costs.measured(machine, read_json(o / "scorecard" / "untrained.json"))
        plan = self.budget.plan("pretrain", post.costs)
        self.planned(plan)
        print(f"[plan] pretraining {plan.seconds:.0f} s of the {plan.left:.0f} s left; kept for what follows at the "
              f"least: {plan.reserved:.0f} s (" + ", ".join(f"{s} {v:.0f} s" for s, v in plan.least.items())
              + f", rows {plan.rows:.0f} s; load {plan.load:.1f} per core)", file=sys.stderr)
        if plan.short and c.short_budget == "refuse":
            raise GroundupError(self.budget.refusal(plan))
        pretrain_file = self._pretrain_file()
        result = self.runner.run("pretrain", f"Pretrain for {plan.seconds:.0f} s", [to_toml(c.pretrain), plan.seconds],
                                 [o / "run"], lambda: self._pretrain(pretrain_file, plan, post.costs))
        self._pretrained(plan, result, post)
        self.runner.run("export_base", "Base model -> OUT/models/base", [], [o / "models" / "base"],
                        lambda: str(self.export(o / "run", "base")))
        post.score("base", o / "models" / "base", native_math=True)
        self.runner.run("samples", "Generate samples", to_toml(c.samples), [o / "samples.json"], self._samples)
        if c.until != "pretrain":
            post.sft()
            if c.until != "sft":
                post.align()
                post.quantize()
                if c.arena.enabled:
                    self._arena()
        return self.finish(post)

    def _arena(self) -> None:
        o, dest, prompts = self.out, self.out / "arena", self.out / "arena-prompts.jsonl"

        def run() -> str:
            write_prompts(o / "chat", prompts, self.cfg.arena.prompts)
            self.verb(*arena_arguments(o, self.cfg.arena, prompts))
            return str(dest / "ratings.json")

        self.runner.run("arena", "Arena: the models judge each other's answers; Bradley-Terry ratings",
                        to_toml(self.cfg.arena), [dest, prompts], run)

    def _early_check(self) -> None:
        """Before the first stage of a fresh demo: refuse a budget that clearly cannot hold the chain."""
        model = dataclasses.replace(self.cfg.pretrain.model, vocab_size=self.cfg.tokenizer.vocab_size)
        started = time.perf_counter()
        self._threads()
        t = self.cfg.pretrain.train
        step_s = train_step_seconds(Transformer(model), t.batch_size, t.seq_len, rounds=2)
        self.budget.spent_before = time.perf_counter() - started
        print(f"[plan] a training step of the pretraining model takes {step_s:.2f} s here now: the chain needs "
              f"about {self.budget.early_least(step_s):.0f} s at the least", file=sys.stderr)
        refusal = self.budget.early_refusal(step_s)
        if refusal:
            raise GroundupError(refusal)

    def data_stages(self) -> None:
        c, o = self.cfg, self.out
        limit = ["--limit", c.limit_per_source] if c.limit_per_source else []
        math = ["--math-max-operand", c.math_max_operand, "--seed", c.seed]
        self.runner.run("sample", "Embedded corpus -> JSONL", [c.chunk_chars, c.math_count, c.math_max_operand, c.seed,
                                                               limit], [o / "raw"],
                        lambda: self.verb("data", "sample", "--out", o / "raw", "--chunk-chars", c.chunk_chars,
                                          "--math-count", c.math_count, *math, *limit))
        if c.until != "pretrain":
            # As many conversations as the fine-tuning stages can use in their share of the budget.
            count = max(2000, round(c.chat_math_count * min(1.0, c.budget_minutes / 15)))
            self.runner.run("chat", "Chat data for fine-tuning", [count, c.math_max_operand, c.seed, limit],
                            [o / "chat"], lambda: self.verb("data", "sample", "--chat", "--out", o / "chat",
                                                            "--math-count", count, *math, *limit))
            if c.tool_chat_share:  # the same questions' stream, solved by calling the calculator or python
                tools = max(200, round(count * c.tool_chat_share))
                self.runner.run("tool_chat", "Tool-use chat data: arithmetic through the calculator or python",
                                [tools, c.math_max_operand, c.seed, limit], [o / "chat-tools"],
                                lambda: self.verb("data", "sample", "--chat", "--tools", "--domains", "math", "--out",
                                                  o / "chat-tools", "--math-count", tools, *math, *limit))
        self.runner.run("curate", "Curate: filter, deduplicate, redact, mix", to_toml(c.curate), [o / "curated"],
                        lambda: self.verb("data", "curate", "--input", o / "raw", "--out", o / "curated",
                                          "--config", self.config_file("curate", c.curate)))
        self.runner.run("tokenizer", "Train the BPE tokenizer", to_toml(c.tokenizer), [o / "tokenizer"],
                        lambda: self.verb("tokenizer", "train", "--input", o / "curated" / "shards",
                                          "--out", o / "tokenizer", "--config",
                                          self.config_file("tokenizer", c.tokenizer)))
        self.runner.run("tokenize", "Tokenize into shards (whole works held out)", to_toml(c.tokenize), [o / "tokens"],
                        lambda: self.verb("data", "tokenize", "--tokenizer", o / "tokenizer", "--input",
                                          o / "curated" / "shards", "--out", o / "tokens", "--config",
                                          self.config_file("tokenize", c.tokenize)))

    def _pretrain_file(self) -> Path:
        cfg = self.cfg.pretrain
        cfg.data.shards = str(self.out / "tokens")
        cfg.data.tokenizer = str(self.out / "tokenizer")
        return self.config_file("pretrain", cfg)

    def _untrained(self) -> str:
        """The pretraining model at its initialisation: the report card's reference row, and scoring it
        measures what a row costs on this machine now, before the pretraining time is planned."""
        import torch

        c = self.cfg.pretrain
        config = c.model
        if c.data.match_vocab:
            config = dataclasses.replace(config, vocab_size=load_tokenizer(self.out / "tokenizer").vocab_size)
        torch.manual_seed(c.train.seed)
        dest = self.out / "models" / "untrained"
        tmp = dest.with_name(".untrained.tmp")
        for path in (tmp, dest):
            if path.exists():
                shutil.rmtree(path)
        save_model(Transformer(config), tmp)
        shutil.copytree(self.out / "tokenizer", tmp / TOKENIZER_DIR)
        tmp.rename(dest)
        return str(dest)

    def _pretrain(self, config: Path, plan, costs: Costs) -> dict:
        """Pretraining, its limit re-planned while it runs as its steps measure the machine (demo/watch.py)."""
        run, limit_file = self.out / "run", self.out / LIMIT_FILE
        write_time_limit(limit_file, plan.seconds)
        limit = [f"train.time_limit_s={plan.seconds}", f"train.time_limit_file={limit_file}"]

        def replan(rate: float, slowdown: float) -> float:
            return self.budget.plan("pretrain", costs.replace(train_tps=rate, slowdown=slowdown), left=plan.left).seconds

        with PretrainWatch(run / "metrics.jsonl", limit_file, plan.seconds, replan) as watch:
            if (run / "checkpoints").is_dir():  # an interrupted demo: continue the run exactly
                self.verb("train", "--resume", run, "--config", config, *limit)
            else:
                if run.exists():
                    shutil.rmtree(run)
                self.verb("train", "--config", config, "--out", run, *limit)
        summary = read_json(run / SUMMARY_FILE)
        return {**{k: summary.get(k) for k in ("steps", "tokens", "val_bpb", "tokens_per_sec", "wall_time_s",
                                               "replans", "time_limit_reached", "time_limit_s")},
                "moves": watch.moves, "rate": watch.rate,
                "slowdown": round(watch.slowdown, 3) if watch.rate else None}  # None: too few steps to tell

    def _pretrained(self, plan, result: dict, post: PostStages) -> None:
        """What pretraining measured goes into the plans of the stages after it."""
        self.plans["pretrain"].update(moves=result.get("moves", []), final_seconds=result.get("time_limit_s"),
                                      slowdown=result.get("slowdown"))
        post.limits["pretrain"] = result.get("time_limit_s") or plan.seconds
        if result.get("rate"):
            post.costs = post.costs.replace(train_tps=result["rate"], slowdown=result.get("slowdown") or 1.0)

    def _samples(self) -> None:
        s = self.cfg.samples
        gen = Generator.from_checkpoint(self.out / "models" / "base")
        items = []
        for domain, prompts in s.prompts.items():
            texts = gen.generate(prompts, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                                 top_k=s.top_k, seed=s.seed)
            items += [{"domain": domain, "prompt": p, "completion": t} for p, t in zip(prompts, texts)]
        for item in items:
            print(f"--- {item['domain']}: {item['prompt']!r}\n{item['prompt']}{item['completion']}\n", file=sys.stderr)
        atomic_write_json(self.out / "samples.json", {
            "settings": {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_k": s.top_k,
                         "seed": s.seed}, "samples": items})

    def finish(self, post: PostStages) -> Path:
        o = self.out
        atomic_write_text(o / "commands.sh", "#!/usr/bin/env bash\n# The commands the demo ran.\nset -e\n"
                          + "\n".join(self.commands) + "\n")
        atomic_write_json(o / "budget.json", {"budget_s": self.budget.total, "stages": self.runner.times(),
                                              "plans": self.plans,
                                              "costs": post.costs.to_dict() if post.costs else None})
        banner("Report card")

        path = write_report(o, title="groundup demo")
        total = sum(self.runner.times().values())
        served = post.served_model()
        print(f"\n{path} written; stages took {total / 60:.1f} min of the {self.cfg.budget_minutes:g}-minute budget "
              f"({self.runner.elapsed() / 60:.1f} min in this run).\n"
              f"Chat with it: groundup chat --model {served}\n"
              f"Serve it:     groundup serve --model {served} --port 8000", file=sys.stderr)
        return path


def run_demo(cfg: DemoConfig, out: str | Path, fresh: bool = False) -> Path:
    return Demo(cfg, Path(out), fresh=fresh).run()

