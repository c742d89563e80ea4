"""Does a calculator fix a small model's arithmetic? Tool SFT against plain SFT from one base model, same steps.

    groundup data sample --chat --tools --out OUT/chat-tools --math-count 4000 --seed 0
    groundup data sample --chat --domains math --out OUT/chat --math-count 4000 --seed 0
    python benchmarks/tool_use.py --base RUN_OR_MODEL --tool-data OUT/chat-tools --plain-data OUT/chat \\
        --out OUT/tool-use --steps 300

Both fine-tunings start from `--base` with the same steps, batch and schedule; the tool one learns the
calculator/python conversations of `data sample --chat --tools` (the same questions as the plain chats of
the same seed), the plain one their worked answers. Both answer the same held-out questions greedily: the
plain model on its own, the tool model with `calculator` and `python` run for it (posttrain/chat_eval.py's
tool_chat_metrics). Prints one JSON object: exact match (strict `Answer:` line, lenient last number) of
each, and for the tool model the share of replies that called a tool and of calls that ran without error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from groundup.cli import main as cli
from groundup.layout import resolve_model_dir
from groundup.loading import load_for_inference
from groundup.posttrain.chat_eval import chat_metrics, tool_chat_metrics
from groundup.posttrain.records import iter_examples
from groundup.tools import ToolRunner, resolve_tools


def fine_tune(base: str, data: list[Path], out: Path, steps: int, batch: int, seq_len: int) -> float:
    """`groundup sft` from `base` on `data` for `steps` steps; its wall time in seconds."""
    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text()).get("seconds", 0.0)
    started = time.perf_counter()
    code = cli(["sft", "--out", str(out), "--quiet", f"base={json.dumps(base)}",
                f"sft.data={json.dumps([str(p) for p in data])}", f"train.max_steps={steps}",
                f"train.batch_size={batch}", f"train.seq_len={seq_len}", "sft.eval_generations=0",
                "eval.every=0", "checkpoint.every=1000", "schedule.peak_lr=1e-3", "schedule.warmup_steps=10"])
    if code:
        sys.exit(f"sft into {out} failed (exit {code})")
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the base model (a run or model directory)")
    ap.add_argument("--tool-data", required=True, type=Path, help="`data sample --chat --tools` output")
    ap.add_argument("--plain-data", required=True, type=Path, help="`data sample --chat --domains math` output")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--heldout", type=int, default=100, help="held-out questions asked")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    tools_run = args.out / "sft-tools"
    plain_run = args.out / "sft-plain"
    seconds = {"tools": fine_tune(args.base, [args.tool_data / "chat-tools-math.jsonl"], tools_run, args.steps,
                                  args.batch, args.seq_len),
               "plain": fine_tune(args.base, [args.plain_data / "chat-math.jsonl"], plain_run, args.steps,
                                  args.batch, args.seq_len)}
    tool_held = list(iter_examples([args.tool_data / "chat-tools-math.heldout.jsonl"]))[: args.heldout]
    plain_held = list(iter_examples([args.plain_data / "chat-math.heldout.jsonl"]))[: args.heldout]
    runner = ToolRunner(resolve_tools("calculator,python"))
    model, tok = load_for_inference(resolve_model_dir(tools_run))
    with_tools = tool_chat_metrics(model, tok, tool_held, runner, args.max_new_tokens)
    model, tok = load_for_inference(resolve_model_dir(plain_run))
    without = chat_metrics(model, tok, plain_held, args.max_new_tokens)
    print(json.dumps({"steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "sft_seconds": seconds,
                      "heldout": len(tool_held), "with_tools": with_tools, "without_tools": without}, indent=1))


if __name__ == "__main__":
    main()
