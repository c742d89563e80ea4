"""One row of the demo's report card per model: the same measurements of base, SFT, aligned and quantized.

    row = score_model("out/models/sft", tokens="out/tokens", chats=heldout, cfg=ScorecardConfig(), scale=1.0)

- bits per byte of each domain's validation split (the pretraining shards' held-out documents; for
  Shakespeare whole works no stage trained on);
- arithmetic exact match, strict (the `Answer:` line) and lenient (the last number), of greedy
  replies to held-out chat problems, and the share of held-out replies of every domain that end
  their turn (posttrain/chat_eval.py: the numbers SFT and GRPO report during training);
- the chance-centred multiple-choice aggregate of the evaluation harness on real benchmark items
  (eval/harness.py, nanochat's CORE centring: 0 is chance, 1 is perfect);
- the weights' size on disk and greedy decode speed (tokens/s, one sequence);
- for the base model, exact match when asked in its pretraining format, the fair measure of what
  pretraining alone gives (it has never seen the chat template);
- with the demo's tool chats: held-out arithmetic answered with the calculator and python run for the
  model (posttrain/chat_eval.py's tool_chat_metrics): exact match, the share of replies that called a
  tool, and the share of calls that ran without error.

The item counts are given for a 15-minute demo and scale with the budget (`scale`), so a 3-minute
demo spends the same share of its time on evaluation; every model of one demo sees the same items.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from groundup.benchmarks import resolve_tasks
from groundup.benchmarks.data import wheel_root
from groundup.errors import DataError
from groundup.eval.harness import EvalSettings, evaluate as run_tasks
from groundup.eval.perplexity import evaluate as perplexity
from groundup.infer import Generator
from groundup.layout import resolve_model_dir
from groundup.loading import load_for_inference
from groundup.posttrain.chat_eval import chat_metrics, chat_replies, native_math_metrics, tool_chat_metrics
from groundup.tools import ToolRunner, resolve_tools


@dataclass
class ScorecardConfig:
    math_problems: int = 200  # held-out arithmetic conversations (at a 15-minute budget)
    chats_per_domain: int = 25  # held-out code and text conversations (end of turn)
    max_new_tokens: int = 64  # longest greedy reply, in tokens; conversations with longer references are not picked
    mc_tasks: str = "arc_easy,piqa,hellaswag,winogrande,openbookqa"  # multiple-choice eval tasks, comma-separated
    mc_items: int = 100  # per task (at a 15-minute budget)
    decode_tokens: int = 64  # tokens generated greedily to measure decoding speed (tokens/s)
    bpb_batches: int = 32  # validation batches of 8 x context tokens per domain (at a 15-minute budget)
    conversations: int = 2  # sample conversations kept per domain (shown before and after alignment)
    tool_problems: int = 60  # held-out arithmetic answered with tools (at a 15-minute budget; 0 = no tool row)
    max_tool_calls: int = 2  # tool calls in one held-out answer, at most


def scaled(n: int, scale: float, least: int = 8) -> int:
    return max(least, round(n * scale))


def pick_chats(examples_by_domain: dict[str, list], cfg: ScorecardConfig, scale: float, tokenizer,
               context: int) -> dict[str, list]:
    """The held-out conversations every model of the demo answers: math problems and some of each other
    domain, those whose whole conversation (prompt and reference reply) fits in the model's context and
    whose reference reply fits in `max_new_tokens`, so that ending the turn is possible."""
    picked = {}
    for domain, examples in examples_by_domain.items():
        n = scaled(cfg.math_problems if domain == "math" else cfg.chats_per_domain, scale)
        keep = []
        for ex in examples:
            if len(keep) == n:
                break
            whole = len(tokenizer.render_chat(ex.messages[: ex.completion_at + 1])[0])
            prompt = len(tokenizer.render_chat(ex.messages[: ex.completion_at], add_generation_prompt=True)[0])
            if whole <= context and whole - prompt <= cfg.max_new_tokens:
                keep.append(ex)
        picked[domain] = keep
    return picked


def weights_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


@torch.no_grad()
def decode_speed(model, tokenizer, tokens: int) -> float:
    """Greedy tokens per second of one sequence, after a warm-up (a reply that ends early counts what it made)."""

    gen = Generator(model, tokenizer)
    prompt = [list(tokenizer.prefix_ids) + tokenizer.encode("ROMEO.\n")]
    gen.complete_ids(prompt, max_new_tokens=4, temperature=0)
    started = time.perf_counter()
    out = gen.complete_ids(prompt, max_new_tokens=tokens, temperature=0)
    took = time.perf_counter() - started
    return len(out[0].token_ids) / took if took else 0.0


def score_model(path: str | Path, *, tokens: str | Path, chats: dict[str, list], cfg: ScorecardConfig,
                scale: float, native_math: bool = False, tool_chats: list | None = None) -> dict:
    """The report card's row for the model at `path` (see the module docstring)."""

    started = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(part: str) -> None:
        timings[part] = round(time.perf_counter() - started - sum(timings.values()), 2)

    model_dir = resolve_model_dir(path)
    model, tok = load_for_inference(model_dir)
    row: dict = {"model": str(path), "timings": timings}
    bpb = perplexity(model, tokens, split="val", tokenizer=tok, max_batches=scaled(cfg.bpb_batches, scale, 4))
    row["bpb"] = {name: r["bpb"] for name, r in bpb["domains"].items()}
    lap("bpb")
    every = [ex for examples in chats.values() for ex in examples]
    found = chat_metrics(model, tok, every, cfg.max_new_tokens)
    row["end_turn"] = found.get("end_turn")
    row["exact_match_strict"] = found.get("exact_match_strict")
    row["exact_match_lenient"] = found.get("exact_match_lenient")
    row["math_problems"] = found.get("answered", 0)
    # The work each timed part did, so the budget can price a token (demo/costs.py): replies run to the
    # token limit at most (an untrained model's always do).
    row["work"] = {"bpb_tokens": bpb.get("tokens", 0), "replies": found.get("replies", 0),
                   "reply_tokens": found.get("replies", 0) * cfg.max_new_tokens}
    lap("chats")
    if native_math:
        native = native_math_metrics(model, tok, chats.get("math", []), cfg.max_new_tokens)
        row["native_exact_match_strict"] = native.get("exact_match_strict")
        row["native_exact_match_lenient"] = native.get("exact_match_lenient")
        lap("native_math")
    if tool_chats:
        tools = tool_chat_metrics(model, tok, tool_chats, ToolRunner(resolve_tools("calculator,python")),
                                  cfg.max_new_tokens, cfg.max_tool_calls)
        row["tool_exact_match_strict"] = tools.get("exact_match_strict")
        row["tool_called"], row["tool_calls_ok"] = tools.get("called"), tools.get("calls_ok")
        row["tool_problems"] = tools.get("answered", 0)
        lap("tools")
    try:
        wheel_root()
    except DataError as e:  # `pip install -e .` without the eval wheel: the card says why the column is empty
        row["mc_centered"], row["mc_note"] = None, str(e)
    else:
        mc = run_tasks(model, tok, resolve_tasks(cfg.mc_tasks),
                       EvalSettings(limit=scaled(cfg.mc_items, scale), bootstrap_iters=0), progress=False)
        aggregate = mc["aggregate"] or {}
        row["mc_centered"] = aggregate.get("value")
        row["mc_tasks"] = {name: t["value"] for name, t in (aggregate.get("tasks") or {}).items()}
        row["mc_items"] = scaled(cfg.mc_items, scale)
    lap("multiple_choice")
    row["size_bytes"] = weights_bytes(model_dir)
    row["decode_tokens_per_s"] = decode_speed(model, tok, cfg.decode_tokens)
    lap("decode")
    shown = [(domain, ex) for domain, examples in chats.items() for ex in examples[: cfg.conversations]]
    replies = chat_replies(model, tok, [ex for _, ex in shown], cfg.max_new_tokens)
    row["conversations"] = [{"domain": domain, "prompt": ex.messages[ex.completion_at - 1]["content"],
                             "reply": out.text} for (domain, ex), out in zip(shown, replies)]
    lap("conversations")
    row["seconds"] = time.perf_counter() - started
    return row
