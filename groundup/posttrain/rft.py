"""`rft(cfg, out)`: rejection-sampling fine-tuning (reinforcement fine-tuning with a grader), in rounds.

    round r:  sample k completions of every prompt from the current model
              -> score them with the rewards -> keep the best per prompt (or all above a threshold)
              -> SFT on the kept completions, starting from the current model -> the next model

    OUT/round_01/samples.jsonl   the kept completions (chat records, with their reward)
    OUT/round_01/run/            the round's SFT run (resumable like any run)
    OUT/rounds.json              per round: mean reward of the samples, kept, held-out greedy reward
    OUT/rft.json                 the settings the rounds were made with (base, prompts, rewards, sampling)

A rerun skips finished rounds and resumes an interrupted one: its SFT run from its last checkpoint,
its sampling from the last chunk of prompts saved (`samples.jsonl.partial`, posttrain/sampling_job.py).
It may add rounds (rft.rounds); a rerun with another base, other prompts, rewards or sampling settings
is refused, naming the key, unless `overwrite` (--overwrite) discards the rounds made before.
A sample whose reward failed is never kept; a round that keeps nothing fine-tunes on nothing and says
why, and one whose rewards never work stops (rft.reward_patience, rewards/health.py).

With tools (rft.tools) each sample is a multi-turn rollout (tool_rollout.py) scored on its final answer,
and a kept sample is the whole trajectory (calls, results, answer) with the tools it was shown: the
round's SFT trains on the assistant's text and calls, never on tool results (the chat format's mask).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

from groundup.errors import ConfigError, DataError
from groundup.infer import Generator
from groundup.io import atomic_write_json, read_json
from groundup.layout import SUMMARY_FILE, claim_output_dir, is_run_dir
from groundup.loading import load_for_inference
from groundup.posttrain.config import RFTConfig
from groundup.posttrain.rollout import no_usable_eval_prompts, read_prompts
from groundup.posttrain.sampled_data import best_completions, nothing_written
from groundup.posttrain.sampling_job import SamplingJob, input_settings
from groundup.posttrain.sft import sft
from groundup.posttrain.tool_rollout import roll_out, tool_runner
from groundup.rewards.functions import load_rewards, score
from groundup.rewards.health import RewardHealth

ROUNDS_FILE = "rounds.json"
SETTINGS_FILE = "rft.json"
SETTINGS_VERSION = 1
_ROUND_DIR = re.compile(r"round_\d{2,}")
SAMPLE_ROWS = 32  # completions sampled together
SAMPLE_CHUNK = 256  # prompts sampled between saves of a round's work


def _heldout_reward(model, tok, prompts, rewards, max_new: int, runner=None, max_tool_calls: int = 4) -> float | None:
    if not prompts:
        return None
    gen = Generator(model, tok)
    if runner is not None:  # the final answer after the tool calls
        outs = roll_out(gen, prompts, runner, max_tool_calls, max_new_tokens=max_new, temperature=0)
    else:
        outs = gen.complete_ids([p.ids for p in prompts], max_new_tokens=max_new, temperature=0)
    return sum(score(rewards, p.text, o.text, p.fields, p.messages)[0] for p, o in zip(prompts, outs)) / len(prompts)


def rft_settings(cfg: RFTConfig) -> dict:
    """What the rounds made so far depend on, by config key (rft.rounds may grow; the device, logging and
    evaluation may change)."""
    r = cfg.rft
    inputs = input_settings(cfg.base, r.prompts, r.rewards, r.reward_weights)
    settings = {"base": inputs["model"], "rft.prompts": inputs["prompts"], "rft.rewards": list(r.rewards),
                "rft.reward_weights": list(r.reward_weights), "rft.samples": r.samples, "rft.threshold": r.threshold,
                "rft.max_new_tokens": r.max_new_tokens, "rft.temperature": r.temperature, "rft.seed": r.seed}
    if r.tools:  # only with tools, so that rounds made before tool use existed still resume
        settings.update({"rft.tools": r.tools, "rft.max_tool_calls": r.max_tool_calls})
    return settings


def _shown(value):
    """A setting as a message shows it: an input by its path(s), not its size and time."""
    if isinstance(value, dict) and "path" in value:
        return value["path"]
    if isinstance(value, list) and value and all(isinstance(v, dict) and "path" in v for v in value):
        return [v["path"] for v in value]
    return value


def _check_settings(out: Path, settings: dict, overwrite: bool) -> None:
    """Refuse rounds made with other settings (naming each key that differs) unless `overwrite`, which
    removes them; then record `settings` with the rounds."""
    saved = out / SETTINGS_FILE
    made = [p for p in out.iterdir() if _ROUND_DIR.fullmatch(p.name) and p.is_dir()] + \
        [p for p in (out / ROUNDS_FILE,) if p.exists()]
    if overwrite:
        for p in made:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    elif saved.is_file():
        before = read_json(saved, dict)
        old = before.get("settings") if before.get("version") == SETTINGS_VERSION else None
        if not isinstance(old, dict):
            raise DataError(f"{saved}: not an rft settings file of this version of groundup; pass --overwrite to "
                            "start the rounds again")
        changed = [k for k in settings if old.get(k) != settings[k]]
        if changed:
            diffs = "; ".join(f"{k}: {_shown(old.get(k))!r} -> {_shown(settings[k])!r}"
                              + (" (changed since)" if _shown(old.get(k)) == _shown(settings[k]) else "")
                              for k in changed)
            raise DataError(f"{out}: made with other settings ({diffs}); use the same ones, another --out, or "
                            "--overwrite to discard its rounds and start again")
    elif made:
        raise DataError(f"{out}: holds rounds without {SETTINGS_FILE} (made by an older groundup), so their settings "
                        "cannot be checked; pass --overwrite to start the rounds again, or choose another --out")
    atomic_write_json(saved, {"version": SETTINGS_VERSION, "settings": settings})


def _sample_round(cfg: RFTConfig, n: int, current: str, gen, prompts, rewards, samples: Path, bad: list,
                  runner=None) -> None:
    """Round n's kept completions into `samples` (and its statistics into sampling.json beside it), a chunk
    of prompts at a time: an interrupted round continues where it stopped (posttrain/sampling_job.py)."""
    r = cfg.rft
    settings = {**input_settings(current, r.prompts, r.rewards, r.reward_weights), "samples": r.samples,
                "threshold": r.threshold, "max_new_tokens": r.max_new_tokens, "temperature": r.temperature,
                "seed": r.seed + n, **({"tools": r.tools, "max_tool_calls": r.max_tool_calls} if r.tools else {})}

    health = RewardHealth([x.name for x in rewards], r.reward_patience, "batches", "rft.reward_patience = 0")

    def build(part, seed):
        errors: list[str] = []
        kept, stats = best_completions(gen, part, rewards, r.samples, r.threshold, errors, health=health,
                                       batch_rows=SAMPLE_ROWS, max_new_tokens=r.max_new_tokens,
                                       temperature=r.temperature, seed=seed, runner=runner,
                                       max_tool_calls=r.max_tool_calls)
        return kept, stats, errors

    if r.threshold is None:
        rule, otherwise = "no threshold: the best of a prompt, if it beats another or scores above 0", \
            "each prompt's samples scored alike, at or below 0"
    else:
        rule, otherwise = f"threshold {r.threshold}", f"none scored at least {r.threshold}; lower it or sample more"

    def nothing(state):
        return f"round {n}: no sample kept ({rule}): " + nothing_written(state["counts"], state["failure_examples"],
                                                                        otherwise)

    job = SamplingJob(samples, settings, resume=None, restart_hint=f"remove {samples.parent} to sample round {n} again",
                      verb="rft")
    with job.locked():
        if job.state["counts"].get("varied"):
            health.varied_before()
        try:
            state = job.run(prompts, build, r.samples, SAMPLE_CHUNK, SAMPLE_ROWS, r.seed + n,
                            progress=cfg.log.progress, nothing=nothing)
        finally:
            job.print_failures()
    counts = state["counts"]
    atomic_write_json(samples.parent / "sampling.json",
                      {"samples": counts["samples"], "mean_reward": counts["reward_sum"] / max(1, counts["samples"]),
                       "kept": counts["kept"], "reward_errors": state["reward_failures"], "skipped_prompts": bad[:20]})


def rft(cfg: RFTConfig, out_dir: str | Path, overwrite: bool = False) -> list[dict]:
    """Run `cfg.rft.rounds` rounds into `out_dir` (finished rounds made with the same settings are reused;
    `overwrite`: discarded); returns their records."""
    out = claim_output_dir(out_dir, "rft", mark=True)  # never into another verb's folder (an SFT run)
    r = cfg.rft
    rewards = load_rewards(r.rewards, r.reward_weights)
    if not r.prompts:
        raise DataError("no prompts: pass --prompts FILE... (prompt or messages records, + the fields rewards read)")
    _check_settings(out, rft_settings(cfg), overwrite)
    history = read_json(out / ROUNDS_FILE, expect=list) if (out / ROUNDS_FILE).is_file() else []
    current = cfg.base
    runner = tool_runner(r.tools)
    shown = runner.schemas() if runner is not None else None
    for n in range(1, r.rounds + 1):
        round_dir = out / f"round_{n:02d}"
        run_dir = round_dir / "run"
        done = run_dir / SUMMARY_FILE
        if n <= len(history) and done.is_file():
            current = str(run_dir)
            continue
        model, tok = load_for_inference(current, device=cfg.train.device, merge=True)
        context = model.cfg.max_seq_len - r.max_new_tokens
        if context < 1:
            raise ConfigError(f"rft.max_new_tokens = {r.max_new_tokens}: at or over the model's context "
                              f"({model.cfg.max_seq_len} tokens); leave room for the prompt", key="rft.max_new_tokens")
        prompts, held, bad = read_prompts(r.prompts, tok, context, shown)
        if r.eval_prompts:
            unmarked, marked, bad2 = read_prompts(r.eval_prompts, tok, context, shown)
            held = unmarked + marked  # every prompt of an eval file is held out, marked split="heldout" or not
            if not held:
                raise no_usable_eval_prompts(r.eval_prompts, bad2)
        held = held[: r.eval_count]
        samples = round_dir / "samples.jsonl"
        if not samples.is_file():
            _sample_round(cfg, n, current, Generator(model, tok), prompts, rewards, samples, bad, runner)
        stats = read_json(round_dir / "sampling.json")
        before = _heldout_reward(model, tok, held, rewards, r.max_new_tokens, runner, r.max_tool_calls)
        del model
        round_cfg = dataclasses.replace(cfg, base=str(current), sft=dataclasses.replace(cfg.sft, data=[str(samples)]))
        summary = sft(round_cfg, run_dir, resume=is_run_dir(run_dir))
        model, tok = load_for_inference(run_dir, device=cfg.train.device, merge=True)
        after = _heldout_reward(model, tok, held, rewards, r.max_new_tokens, runner, r.max_tool_calls)
        record = {"round": n, "base": str(current), "samples": stats["samples"], "sample_reward": stats["mean_reward"],
                  "kept": stats["kept"], "heldout_reward_before": before, "heldout_reward_after": after,
                  "sft_steps": summary["steps"], "reward_errors": stats.get("reward_errors", 0)}
        history = history[: n - 1] + [record]
        atomic_write_json(out / ROUNDS_FILE, history)
        print(f"round {n}: {stats['kept']:,} of {stats['samples']:,} samples kept (mean reward "
              f"{stats['mean_reward']:.3f}, {record['reward_errors']:,} reward failures); held-out greedy reward "
              f"{before} -> {after}")
        current = str(run_dir)
    return history
