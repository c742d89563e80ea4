"""`groundup demo`: the whole chain on the embedded corpus, within a time budget, then a report card.

    OUT/raw/            the embedded corpus as JSONL                        (groundup data sample)
    OUT/chat/           conversations for fine-tuning, held-out files apart (groundup data sample --chat)
    OUT/curated/        filtered, deduplicated, mixed shards                (groundup data curate)
    OUT/tokenizer/      byte-level BPE                                      (groundup tokenizer train)
    OUT/tokens/         token shards; whole Shakespeare works held out      (groundup data tokenize)
    OUT/run/            pretraining, fitted to its share of the budget      (groundup train)
    OUT/sft/            supervised fine-tuning on the chat data             (groundup sft)
    OUT/align/          GRPO on arithmetic (or DPO on sampled pairs)        (groundup grpo / data pairs + dpo)
    OUT/models/         base, sft, aligned, aligned-int8: model directories (groundup quantize for the last)
    OUT/scorecard/      one JSON row per model: the report card's table
    OUT/samples.json    the base model's completions of a few prompts per domain
    OUT/report.md       the report card, with OUT/plots/*.png               (groundup report OUT)

Each stage runs the stage's own CLI verb on a config file the demo writes to OUT/configs/, so the
exact commands are in OUT/commands.sh and each stage can be rerun by hand. How the budget is split
between the stages: demo/budget.py.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from groundup.cli import main as cli
from groundup.config import save_config, to_toml
from groundup.demo.budget import DemoBudget
from groundup.demo.config import DemoConfig
from groundup.demo.post import PostStages
from groundup.demo.stages import StageRunner, banner
from groundup.errors import GroundupError
from groundup.infer import Generator
from groundup.io import atomic_write_json, atomic_write_text, ensure_writable_dir, read_json
from groundup.layout import (MODEL_CONFIG_FILE, SUMMARY_FILE, TOKENIZER_DIR, WEIGHTS_FILE, find_tokenizer_dir,
                             resolve_model_dir)
from groundup.model import Transformer
from groundup.model.model_dir import save_model
from groundup.report import write_report
from groundup.tokenizer import load_tokenizer
from groundup.train.threads import fastest_threads


class Demo:
    def __init__(self, cfg: DemoConfig, out: Path, fresh: bool = False):
        self.cfg, self.out = cfg, ensure_writable_dir(out)
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

    def planned(self, stage: str, plan) -> None:
        self.plans[stage] = {"seconds": plan.seconds, "budget_left": plan.left, "reserved": plan.reserved}

    # ------------------------------------------------------------------ stages

    def run(self) -> Path:
        c, o = self.cfg, self.out
        self.data_stages()
        post = PostStages(self)
        self.runner.run("untrained", "Untrained model -> OUT/models/untrained", to_toml(c.pretrain.model),
                        [o / "models" / "untrained"], self._untrained)
        post.score("untrained", o / "models" / "untrained", counted=False)
        plan = self.budget.plan("pretrain", post.row_seconds)
        self.planned("pretrain", plan)
        pretrain_file = self._pretrain_file()
        self.runner.run("pretrain", f"Pretrain for {plan.seconds:.0f} s", [to_toml(c.pretrain), plan.seconds],
                        [o / "run"], lambda: self._pretrain(pretrain_file, plan.seconds))
        self.runner.run("export_base", "Base model -> OUT/models/base", [], [o / "models" / "base"],
                        lambda: str(self.export(o / "run", "base")))
        post.score("base", o / "models" / "base", native_math=True)
        self.runner.run("samples", "Generate samples", to_toml(c.samples), [o / "samples.json"], self._samples)
        if c.until != "pretrain":
            post.sft()
            if c.until != "sft":
                post.align()
                post.quantize()
        return self.finish(post)

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
        import dataclasses

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

    def _pretrain(self, config: Path, seconds: float) -> dict:
        run = self.out / "run"
        limit = f"train.time_limit_s={seconds}"
        if (run / "checkpoints").is_dir():  # an interrupted demo: continue the run exactly
            self.verb("train", "--resume", run, "--config", config, limit)
        else:
            if run.exists():
                shutil.rmtree(run)
            self.verb("train", "--config", config, "--out", run, limit)
        summary = read_json(run / SUMMARY_FILE)
        return {k: summary.get(k) for k in ("steps", "tokens", "val_bpb", "tokens_per_sec", "wall_time_s", "replans",
                                            "time_limit_reached")}

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
                                              "plans": self.plans})
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
