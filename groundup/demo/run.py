"""`groundup demo`: the whole chain on the embedded corpus, within a time budget, then a report card.

    OUT/raw/          the embedded corpus as JSONL             (groundup data sample)
    OUT/curated/      filtered, deduplicated, mixed shards     (groundup data curate)
    OUT/tokenizer/    byte-level BPE                           (groundup tokenizer train)
    OUT/tokens/       token shards with a validation split     (groundup data tokenize)
    OUT/probe/        a few timed steps: throughput -> the step count that fits the budget
    OUT/run/          the pretraining run                      (groundup train)
    OUT/model/        the final model + tokenizer: --checkpoint OUT/model for generate/chat/export
    OUT/eval.json     validation loss and bits per byte per domain
    OUT/samples.json  generations for a few prompts per domain
    OUT/report.md     the report card, with OUT/plots/*.png  (groundup report OUT)

Each stage runs the stage's own CLI verb on a config file the demo writes to OUT/configs/, so the
exact commands are in OUT/commands.sh and each stage can be rerun by hand.
"""

from __future__ import annotations

import math
import shlex
import shutil
import sys
from pathlib import Path

from groundup.cli import main as cli
from groundup.config import save_config, to_toml
from groundup.demo.config import DemoConfig
from groundup.demo.stages import StageRunner, banner
from groundup.errors import GroundupError
from groundup.io import atomic_write_json, atomic_write_text, ensure_writable_dir, read_json
from groundup.layout import SUMMARY_FILE


class Demo:
    def __init__(self, cfg: DemoConfig, out: Path, fresh: bool = False):
        self.cfg, self.out = cfg, ensure_writable_dir(out)
        self.runner = StageRunner(self.out, fresh=fresh)
        self.commands: list[str] = []
        (self.out / "configs").mkdir(exist_ok=True)
        save_config(cfg, self.out / "configs" / "demo.toml")

    # ------------------------------------------------------------------ helpers

    def _verb(self, *args: str) -> None:
        """Run one `groundup` verb in this process; a non-zero exit stops the demo."""
        words = [str(a) for a in args]
        self.commands.append("groundup " + " ".join(shlex.quote(w) for w in words))
        code = cli(words)
        if code:
            raise GroundupError(f"stage command failed (exit {code}): groundup {' '.join(words)}")

    def _config_file(self, name: str, cfg) -> Path:
        path = self.out / "configs" / f"{name}.toml"
        save_config(cfg, path)
        return path

    def budget_left(self) -> float:
        """The budget less the recorded time of the stages so far: a rerun that reuses them plans the
        same pretraining run (and reuses it too), whatever this invocation's own clock says."""
        return self.cfg.budget_minutes * 60 - sum(self.runner.times().values())

    # ------------------------------------------------------------------ stages

    def run(self) -> Path:
        c, o = self.cfg, self.out
        limit = ["--limit", c.limit_per_source] if c.limit_per_source else []
        self.runner.run("sample", "Embedded corpus -> JSONL", [c.chunk_chars, c.math_count, c.seed, limit],
                        [o / "raw"], lambda: self._verb("data", "sample", "--out", o / "raw", "--chunk-chars",
                                                        c.chunk_chars, "--math-count", c.math_count, "--seed", c.seed,
                                                        *limit))
        self.runner.run("curate", "Curate: filter, deduplicate, redact, mix", to_toml(c.curate), [o / "curated"],
                        lambda: self._verb("data", "curate", "--input", o / "raw", "--out", o / "curated",
                                           "--config", self._config_file("curate", c.curate)))
        self.runner.run("tokenizer", "Train the BPE tokenizer", to_toml(c.tokenizer), [o / "tokenizer"],
                        lambda: self._verb("tokenizer", "train", "--input", o / "curated" / "shards",
                                           "--out", o / "tokenizer", "--config",
                                           self._config_file("tokenizer", c.tokenizer)))
        self.runner.run("tokenize", "Tokenize into shards (train/val split)", to_toml(c.tokenize), [o / "tokens"],
                        lambda: self._verb("data", "tokenize", "--tokenizer", o / "tokenizer", "--input",
                                           o / "curated" / "shards", "--out", o / "tokens", "--config",
                                           self._config_file("tokenize", c.tokenize)))
        pretrain_file = self._pretrain_file()
        probe = self.runner.run("probe", "Measure training throughput", [to_toml(c.pretrain), c.probe_steps],
                                [o / "probe"], lambda: self._probe(pretrain_file))
        plan = self._plan(probe["steps_per_second"], probe["overhead_s"])
        self.runner.run("pretrain", f"Pretrain: {plan['steps']} steps", [to_toml(c.pretrain), plan],
                        [o / "run"], lambda: self._pretrain(pretrain_file, plan))
        self.runner.run("export_model", "Final model -> OUT/model", [], [o / "model"], self._final_model)
        self.runner.run("evaluate", "Evaluate: validation loss and bits per byte", [], [o / "eval.json"],
                        self._evaluate)
        self.runner.run("samples", "Generate samples", to_toml(c.samples), [o / "samples.json"], self._samples)
        atomic_write_text(o / "commands.sh", "#!/usr/bin/env bash\n# The commands the demo ran.\nset -e\n"
                          + "\n".join(self.commands) + "\n")
        banner("Report card")
        from groundup.report import write_report

        path = write_report(o, title="groundup demo")
        total = sum(self.runner.times().values())
        print(f"\n{path} written; stages took {total / 60:.1f} min in all "
              f"({self.runner.elapsed() / 60:.1f} min in this run).\n"
              f"Next: groundup generate --checkpoint {o / 'model'} --prompt 'ROMEO.'", file=sys.stderr)
        return path

    def _pretrain_file(self) -> Path:
        cfg = self.cfg.pretrain
        cfg.data.shards = str(self.out / "tokens")
        cfg.data.tokenizer = str(self.out / "tokenizer")
        return self._config_file("pretrain", cfg)

    def _probe(self, config: Path) -> dict:
        probe = self.out / "probe"
        if probe.exists():
            shutil.rmtree(probe)
        self._verb("train", "--config", config, "--out", probe, "--quiet", f"train.max_steps={self.cfg.probe_steps}",
                   "eval.every=0", "eval.at_end=false", f"checkpoint.every={self.cfg.probe_steps}")
        summary = read_json(probe / SUMMARY_FILE)
        # Startup (model build, data, the final checkpoint) is paid once per run; steps scale.
        return {"steps_per_second": summary["steps"] / summary["train_time_s"],
                "overhead_s": summary["wall_time_s"] - summary["train_time_s"],
                "tokens_per_sec": summary.get("tokens_per_sec")}

    def _plan(self, steps_per_second: float, overhead_s: float) -> dict:
        """The step count (and eval/checkpoint cadence) that fits the time left."""
        c = self.cfg
        seconds = self.budget_left() - c.reserve_seconds - overhead_s
        # A validation pass is max_batches forward passes per domain (3 domains), each about a third
        # of a training step's cost: evals * max_batches step-equivalents in all.
        eval_steps = c.evals * c.pretrain.eval.max_batches
        steps = max(c.min_steps, int(seconds * steps_per_second - eval_steps))
        every = max(1, math.ceil(steps / c.evals))
        return {"steps": steps, "eval_every": every, "checkpoint_every": every,
                "seconds_planned": round(max(seconds, 0.0), 1), "steps_per_second": round(steps_per_second, 3)}

    def _pretrain(self, config: Path, plan: dict) -> dict:
        run = self.out / "run"
        overrides = [f"train.max_steps={plan['steps']}", f"eval.every={plan['eval_every']}",
                     f"checkpoint.every={plan['checkpoint_every']}"]
        if (run / "checkpoints").is_dir():  # an interrupted demo: continue the run exactly
            self._verb("train", "--resume", run, "--config", config, *overrides)
        else:
            if run.exists():
                shutil.rmtree(run)
            self._verb("train", "--config", config, "--out", run, *overrides)
        return read_json(run / SUMMARY_FILE)

    def _final_model(self) -> None:
        from groundup.layout import MODEL_CONFIG_FILE, TOKENIZER_DIR, WEIGHTS_FILE, find_tokenizer_dir, resolve_model_dir

        source = resolve_model_dir(self.out / "run")
        tmp = self.out / ".model.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for name in (WEIGHTS_FILE, MODEL_CONFIG_FILE):
            shutil.copy2(source / name, tmp / name)
        shutil.copytree(find_tokenizer_dir(source), tmp / TOKENIZER_DIR)
        if (self.out / "model").exists():
            shutil.rmtree(self.out / "model")
        tmp.rename(self.out / "model")
        print(f"{self.out / 'model'}: weights of {source}", file=sys.stderr)

    def _evaluate(self) -> dict:
        from groundup.eval.perplexity import evaluate
        from groundup.model.io import load_model

        model = load_model(self.out / "model").eval()
        result = evaluate(model, self.out / "tokens", split="val", tokenizer=self.out / "model" / "tokenizer")
        atomic_write_json(self.out / "eval.json", result)
        for domain, r in result.get("domains", {}).items():
            print(f"  {domain:<6} loss {r['loss']:.4f}  bits/byte {r['bpb']:.4f}", file=sys.stderr)
        return {"bpb": result.get("bpb")}

    def _samples(self) -> None:
        from groundup.infer import Generator

        s = self.cfg.samples
        gen = Generator.from_checkpoint(self.out / "model")
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


def run_demo(cfg: DemoConfig, out: str | Path, fresh: bool = False) -> Path:
    return Demo(cfg, Path(out), fresh=fresh).run()
