"""Ablate the demo's pretraining recipe: each variant trains for the same wall-clock time.

    .venv/bin/python scripts/ablate_demo.py --out /tmp/ablate --train-minutes 12 baseline muon wsd ...

Every variant runs `groundup demo until=pretrain` in the same output directory, so the data stages
(corpus, curation, tokenizer, token shards) run once and are reused, and only pretraining, the base
model's report-card row and the samples rerun. The budget is chosen so that pretraining's time
limit (`train.time_limit_s`) is `--train-minutes`; bits per byte are measured on the whole
validation split. Results land in OUT/ablation.jsonl (one line per variant) and are printed as a
Markdown table; docs/demo-recipe.md records them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from groundup.cli import main as cli
from groundup.demo.budget import FIXED_SECONDS
from groundup.demo.config import DemoConfig


def lr(peak: str, floor: str = "3e-4") -> list[str]:
    return [f"pretrain.schedule.peak_lr={peak}", f"pretrain.schedule.min_lr={floor}"]


# The recipe the ablation started from. Every variant is spelled out over it (not over the demo's
# current defaults, which are the winner), so docs/demo-recipe.md's commands keep reproducing.
START = ["pretrain.model.d_model=192", "pretrain.model.n_heads=6", "pretrain.model.n_kv_heads=2",
         "pretrain.model.d_ff=512", "pretrain.model.max_seq_len=256", "pretrain.train.seq_len=256",
         "pretrain.train.batch_size=16", "pretrain.optim.name=adamw", *lr("3e-3")]
SMALL = ["pretrain.model.d_model=128", "pretrain.model.n_heads=4", "pretrain.model.d_ff=384"]
# Muon's update is scaled to AdamW's RMS (match_rms_adamw), so one peak rate drives both parts.
MUON = ["pretrain.optim.name=muon", *lr("0.02")]
MUON_1E2 = ["pretrain.optim.name=muon", *lr("1e-2", "1e-3")]
SEQ128 = ["pretrain.train.seq_len=128", "pretrain.train.batch_size=32"]  # same tokens per step
CTX128 = [*SEQ128, "pretrain.model.max_seq_len=128"]  # the model's context too: evaluated at 128

# name -> demo overrides (applied after START)
VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "muon": MUON,
    "wsd": ["pretrain.schedule.kind=wsd", "pretrain.schedule.decay_fraction=0.3"],
    "lr1e-3": lr("1e-3", "1e-4"),
    "lr6e-3": lr("6e-3", "6e-4"),
    "small-d128-l4": SMALL,
    "wide-d256-l4": ["pretrain.model.d_model=256", "pretrain.model.n_heads=8", "pretrain.model.d_ff=704"],
    "deep-d192-l6": ["pretrain.model.n_layers=6"],
    "batch8": ["pretrain.train.batch_size=8"],
    "batch32": ["pretrain.train.batch_size=32"],
    "seq128": SEQ128,
    "bf16-weights": ["pretrain.precision.mode=bf16-weights"],
    "text-weighted": ["pretrain.data.domain_weights={text = 0.6, code = 0.3, math = 0.1}"],
    "vocab8192": ["tokenizer.vocab_size=8192"],
    "muon-d128": [*SMALL, *MUON],
    "muon-d128-lr1e-2": [*SMALL, *MUON_1E2],
    "muon-d128-lr4e-2": [*SMALL, "pretrain.optim.name=muon", *lr("4e-2", "4e-3")],
    "muon-d128-seq128": [*SMALL, *MUON, *SEQ128],
    "muon-d128-batch8": [*SMALL, *MUON, "pretrain.train.batch_size=8"],
    "muon-d128-l6": [*SMALL, *MUON, "pretrain.model.n_layers=6"],
    "muon-d128-ctx128-lr1e-2": [*SMALL, *MUON_1E2, *CTX128],  # the demo's default recipe
    "muon-d192-ctx128-lr1e-2": [*MUON_1E2, *CTX128],
}


DATA_STAGES = ("sample", "curate", "tokenizer", "tokenize")


FIXED = ["until=pretrain", "scorecard.bpb_batches=1000000"]  # the whole validation split


def prepare_data(demo: Path, extra: list[str]) -> float:
    """Run the data stages once (with a token pretraining run) and return their recorded minutes."""
    stages = demo / "stages.json"
    if not stages.exists() or any(s not in json.loads(stages.read_text()) for s in DATA_STAGES):
        cli(["demo", "--out", str(demo), "--budget-minutes", "0.01", *extra, *FIXED, "pretrain.eval.max_batches=1"])
    recorded = json.loads(stages.read_text())
    return sum(recorded[s]["seconds"] for s in DATA_STAGES) / 60


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--train-minutes", type=float, default=12.0)
    p.add_argument("--extra", nargs="*", default=[], help="overrides applied to every variant")
    p.add_argument("variants", nargs="+", choices=sorted(VARIANTS))
    args = p.parse_args()
    log = args.out / "ablation.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    data_minutes = prepare_data(args.out / "demo", args.extra)
    for name in args.variants:
        overrides = [*START, *args.extra, *VARIANTS[name], *FIXED]
        # The demo charges the (reused) data stages' recorded time to the budget, then keeps the
        # evaluation share and the report's seconds (demo/budget.py); the rest is pretraining's.
        share = DemoConfig().shares.evaluation
        budget = (args.train_minutes + data_minutes + FIXED_SECONDS["report"] / 60) / (1 - share)
        start = time.perf_counter()
        code = cli(["demo", "--out", str(args.out / "demo"), "--budget-minutes", str(budget), *overrides])
        seconds = time.perf_counter() - start
        demo = args.out / "demo"
        row = {"variant": name, "overrides": overrides, "exit": code, "seconds": round(seconds, 1)}
        if code == 0:
            bpb = json.loads((demo / "scorecard" / "base.json").read_text())["bpb"]
            summary = json.loads((demo / "run" / "summary.json").read_text())
            row.update(text_bpb=bpb["text"], code_bpb=bpb["code"], math_bpb=bpb["math"], steps=summary["steps"],
                       tokens=summary["tokens"], tokens_per_sec=round(summary["tokens_per_sec"]))
            shutil.copy2(demo / "report.md", args.out / f"report-{name}.md")
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    print("\n| variant | text bpb | code bpb | math bpb | steps | tokens | tokens/s |\n| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r.get("exit") == 0:
            print(f"| {r['variant']} | {r['text_bpb']:.4f} | {r['code_bpb']:.4f} | {r['math_bpb']:.4f} | "
                  f"{r['steps']:,} | {r['tokens']:,} | {r['tokens_per_sec']:,} |")


if __name__ == "__main__":
    main()
