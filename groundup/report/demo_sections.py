"""The demo's report-card sections: the models table, the time budget, held-out works, post-training
curves and conversations before and after alignment.

Inputs (groundup/demo/): OUT/scorecard/NAME.json (one row per model), OUT/budget.json (each stage's
planned and measured seconds), OUT/tokens/index.json (the groups each split holds), OUT/sft and
OUT/align (training runs: metrics.jsonl).
"""

from __future__ import annotations

from pathlib import Path

from groundup.report.plots import series, read_metrics
from groundup.report.sections import markdown_table

ROW_ORDER = ["untrained", "base", "sft", "aligned", "aligned-int8"]


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _share(value, whole: float = 1.0) -> str:
    """A share of `whole` as a percentage; "-" where it is missing or undefined (NaN)."""
    return "-" if value is None or value != value else f"{100 * value / whole:.1f}%"


def _f(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def scorecard_section(rows: list[dict]) -> list[str]:
    rows = sorted(rows, key=lambda r: ROW_ORDER.index(r["name"]) if r["name"] in ROW_ORDER else len(ROW_ORDER))
    domains = sorted({d for r in rows for d in r.get("bpb", {})})
    table = []
    for r in rows:
        name = f"**{r['name']}**" + (" (skipped: the previous model)" if r.get("skipped") else "")
        table.append([name, *[_f(r.get("bpb", {}).get(d)) for d in domains],
                      _pct(r.get("exact_match_strict")), _pct(r.get("exact_match_lenient")), _pct(r.get("end_turn")),
                      _f(r.get("mc_centered")), f"{r.get('size_bytes', 0) / 1e6:.2f}",
                      f"{r.get('decode_tokens_per_s', 0):,.0f}"])
    header = ["model", *[f"{d} bpb" for d in domains], "arithmetic EM (strict)", "EM (lenient)", "ends turn",
              "MC (centred)", "weights MB", "decode tok/s"]
    first = rows[0] if rows else {}
    out = ["## The models", ""] + markdown_table(header, table)
    notes = [f"Bits per byte: the validation split of each domain (lower is better). Exact match: greedy replies to "
             f"{first.get('math_problems', 0)} held-out arithmetic conversations (strict: the `Answer:` line; "
             "lenient: the last number). Ends turn: the share of held-out replies of every domain that end with "
             "the end-of-turn token. Decode: greedy tokens/s of one sequence on this machine."]
    if first.get("mc_tasks"):
        notes.append(f"MC: the chance-centred mean accuracy over {', '.join(first['mc_tasks'])} "
                     f"({first.get('mc_items', 0)} items each; 0 is chance).")
    notes += [f"{r['name']}: {r['skipped']}." for r in rows if r.get("skipped")]
    if first.get("mc_note"):
        notes.append(f"MC not measured: {first['mc_note']}.")
    notes.append("The untrained model (the pretraining model at its initialisation) is the reference for "
                 "chance; it is scored first, which also measures what a row costs before the budget is split.")
    base = next((r for r in rows if r.get("native_exact_match_strict") is not None), None)
    if base is not None:
        notes.append(f"The base model has never seen the chat template; asked in its pretraining format "
                     f"(`Question: ...\\nSolution:`) its exact match is {_pct(base['native_exact_match_strict'])} "
                     f"strict, {_pct(base.get('native_exact_match_lenient'))} lenient.")
    return out + [" ".join(notes), ""] + _tool_table(rows)


def _tool_table(rows: list[dict]) -> list[str]:
    """Held-out arithmetic answered with the calculator and python run for the model (demo/scorecard.py)."""
    rows = [r for r in rows if r.get("tool_problems")]
    if not rows:
        return []
    table = [[f"**{r['name']}**", _pct(r.get("tool_exact_match_strict")), _pct(r.get("tool_called")),
              _pct(r.get("tool_calls_ok"))] for r in rows]
    header = ["model", "arithmetic EM with tools (strict)", "replies that called a tool", "calls that ran"]
    return (["### Tool use", ""] + markdown_table(header, table)
            + [f"{rows[0]['tool_problems']} held-out arithmetic conversations asked with `calculator` and `python` "
               "defined; the model's calls run and their results join the conversation (at most "
               "`scorecard.max_tool_calls` a reply); exact match reads the final reply's `Answer:` line. "
               "Calls that ran: parsed, named a tool and ran without error.", ""])


def budget_section(budget: dict, stages: dict) -> list[str]:
    total = budget.get("budget_s") or 0
    used = sum(v.get("seconds", 0) for v in stages.values())
    plans = budget.get("plans") or {}
    rows = []
    for name, plan in plans.items():
        actual = (stages.get(name) or {}).get("seconds")
        final = plan.get("final_seconds") or plan["seconds"]
        limit = f"{plan['seconds']:.0f}" + (f" -> {final:.0f}" if abs(final - plan["seconds"]) >= 0.5 else "")
        rows.append([name, limit, "-" if actual is None else f"{actual:.0f}", f"{plan['budget_left']:.0f}",
                     f"{plan['reserved']:.0f}", _f((plan.get("least") or {}).get(name), 0)])
    out = ["## Time budget", "",
           f"{used:.0f} s of the {total:.0f} s budget used ({100 * used / total:.0f}%)." if total else "", ""]
    if rows:
        out += ["Each training stage's time limit was set when it started: its least (start-up, a few steps and "
                "its evaluations, at this machine's measured speed), plus its share of what the budget left "
                "after the least of everything still to come (the other training stages' few steps, the "
                "report-card rows at their measured price, quantization and the report), split by the shares "
                "in the demo's config (docs/demo-recipe.md says how they were chosen).", ""]
        out += markdown_table(["training stage", "limit (s)", "took (s)", "budget left at start (s)",
                               "kept for it and what follows (s)", "its least (s)"], rows)
        out += ["", " ".join(_load_notes(plans, budget.get("costs") or {})), ""]
    return out


def _load_notes(plans: dict, costs: dict) -> list[str]:
    """How the machine's load changed the plan, in words."""
    notes = []
    first = plans.get("pretrain")
    if first:
        least = ", ".join(f"{s} {v:.0f} s" for s, v in (first.get("least") or {}).items())
        notes.append(f"When pretraining was planned the load was {first.get('load', 1):.1f} per core; the least "
                     f"of each training stage at that speed was {least}, and the report-card rows to come "
                     f"{first.get('rows', 0):.0f} s.")
        moves = first.get("moves") or []
        if moves:
            steps = "; ".join(f"after {m['after_s']:.0f} s, {m['slowdown']:.2f}x the planned step time: "
                              f"{m['from_s']:.0f} -> {m['to_s']:.0f} s" for m in moves)
            notes.append(f"While it ran, its own steps measured the machine and its limit was re-planned with "
                         f"every cost still to come scaled to match ({steps}).")
        elif first.get("slowdown") is not None:
            notes.append(f"While it ran the machine's speed held ({first['slowdown']:.2f}x the planned step time "
                         "at the end), and its limit stayed.")
        else:
            notes.append("It made too few steps for its own speed to be measured while it ran, and its limit stayed.")
    for name, plan in plans.items():
        if plan.get("short"):
            notes.append(f"{name}: the budget left ({plan['budget_left']:.0f} s) was less than the least of what "
                         f"followed ({plan['reserved']:.0f} s), so it ran its few steps anyway, past the budget.")
    if costs.get("int8_ratio"):
        notes.append(f"An int8 forward measured {costs['int8_ratio']:.1f}x a float one here, and the quantized "
                     "model's row was reserved at that price.")
    return notes


def heldout_section(index: dict) -> list[str]:
    groups = (index.get("groups") or {}).get("val")
    field = index.get("split_group")
    if not field or not groups:
        return []
    names = ", ".join(g.replace("_", " ") for g in groups)
    return ["## Held out", "",
            f"The validation split holds whole groups by the record field `{field}`: every chunk and every "
            f"edition of {names}. No stage trained on them, the tokenizer included, so the text bits per byte "
            "measure generalisation to unseen works.", ""]


def plot_posttraining(sft_metrics: Path, align_metrics: Path, out_dir: Path) -> dict[str, Path]:
    """sft_loss.png (train and held-out loss by step) and align.png (reward and KL, or DPO's loss and margin)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    train, evals, _ = read_metrics(sft_metrics)
    if train:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot(*series(train, "step", "loss"), label="train", linewidth=1)
        vx, vy = series(evals, "step", "val_loss")
        if vx:
            ax.plot(vx, vy, "o-", label="held out", markersize=3)
        ax.set(xlabel="step", ylabel="loss (nats/token)", title="SFT loss")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "sft_loss.png", dpi=110)
        plt.close(fig)
        written["sft_loss"] = out_dir / "sft_loss.png"
    train, _, _ = read_metrics(align_metrics)
    keys = [k for k in ("reward", "kl", "margin", "loss") if any(k in r for r in train)][:2]
    if train and keys:
        fig, axes = plt.subplots(1, len(keys), figsize=(7, 3))
        for ax, key in zip(axes if len(keys) > 1 else [axes], keys):
            ax.plot(*series(train, "step", key), linewidth=1)
            ax.set(xlabel="step", title=key)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "align.png", dpi=110)
        plt.close(fig)
        written["align"] = out_dir / "align.png"
    return written


def posttraining_section(plots: dict[str, Path], root: Path) -> list[str]:
    out = ["## Fine-tuning and alignment", ""]
    for name, caption in (("sft_loss", "SFT loss"), ("align", "Alignment: reward and KL to the SFT model by step")):
        if name in plots:
            out += [f"{caption}:", "", f"![{name}]({plots[name].relative_to(root).as_posix()})", ""]
    return out if len(out) > 2 else []


def conversations_section(rows: dict[str, dict]) -> list[str]:
    before, after = rows.get("sft"), rows.get("aligned")
    if not before:
        return []
    out = ["## Conversations before and after alignment", "",
           "Greedy replies to held-out conversations" + (", from the SFT model and then the aligned model." if after
                                                          else ", from the SFT model."), ""]
    after_replies = {c["prompt"]: c["reply"] for c in (after or {}).get("conversations", [])}
    for conv in before.get("conversations", []):
        out += [f"**{conv['domain']}**: {conv['prompt'].strip()[:300]}", "", "SFT:", "```", conv["reply"].strip(), "```"]
        if conv["prompt"] in after_replies:
            out += ["Aligned:", "```", after_replies[conv["prompt"]].strip(), "```"]
        out.append("")
    return out


def arena_section(results: dict) -> list[str]:
    """The demo's arena (OUT/arena/ratings.json, groundup arena): ratings with intervals, win rates against the
    base model, and how often the judge agreed with itself when the answers swapped places."""
    out = ["## Arena", ""]
    if not results.get("models"):
        return out + ["No battle could be rated (see arena/report.md).", ""]
    lc = results.get("length_controlled") or {}
    table = []
    for r in results["models"]:
        low, high = r.get("rank_range") or (r["rank"], r["rank"])
        win = lc.get(r["model"], {})
        table.append([f"**{r['model']}**", f"{r['rating']:.0f}", f"{r['lower']:.0f} to {r['upper']:.0f}",
                      f"{low}-{high}" if low != high else str(low), f"{r['wins']}/{r['ties']}/{r['losses']}",
                      _share(win.get("win_rate"), 100), _share(win.get("length_controlled_winrate"), 100)])
    out += markdown_table(["model", "rating", "95% interval", "rank", "won/tied/lost", "win rate vs base",
                           "length-controlled"], table)
    judges = results.get("judge_agreement") or {}
    notes = [f"Bradley-Terry ratings fitted as FastChat's `compute_mle_elo` (base 10, scale 400, mean 1000) on "
             f"{results.get('battles', 0):,} battles, each judged in both orders (a battle whose two verdicts "
             "disagree counts as a tie); intervals from "
             f"{results.get('config', {}).get('bootstrap', 0)} bootstrap rounds."]
    for judge, a in judges.items():
        notes.append(f"The judge ({Path(judge).name or judge}) gave the same verdict in both orders in "
                     f"{_share(a.get('agreement'))} of {a.get('pairs', 0)} battles, and the answer shown first won "
                     f"{_share(a.get('first_shown_won'))} of its decisive verdicts: a judge this small mostly "
                     "reflects position bias; name a real one with arena.judge=URL#model.")
    return out + [" ".join(notes), "", "Details: arena/report.md.", ""]
