"""`rft(cfg, out)`: rejection-sampling fine-tuning (reinforcement fine-tuning with a grader), in rounds.

    round r:  sample k completions of every prompt from the current model
              -> score them with the rewards -> keep the best per prompt (or all above a threshold)
              -> SFT on the kept completions, starting from the current model -> the next model

    OUT/round_01/samples.jsonl   the kept completions (chat records, with their reward)
    OUT/round_01/run/            the round's SFT run (resumable like any run)
    OUT/rounds.json              per round: mean reward of the samples, kept, held-out greedy reward

A rerun skips finished rounds and resumes an interrupted one: its SFT run from its last checkpoint,
its sampling from the last chunk of prompts saved (`samples.jsonl.partial`, posttrain/sampling_job.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from groundup.errors import DataError
from groundup.infer import Generator
from groundup.io import atomic_write_json, ensure_writable_dir, read_json
from groundup.layout import SUMMARY_FILE, is_run_dir
from groundup.loading import load_for_inference
from groundup.posttrain.config import RFTConfig
from groundup.posttrain.rollout import read_prompts
from groundup.posttrain.sampled_data import best_completions
from groundup.posttrain.sampling_job import SamplingJob, input_settings
from groundup.posttrain.sft import sft
from groundup.rewards.functions import load_rewards, score

ROUNDS_FILE = "rounds.json"
SAMPLE_ROWS = 32  # completions sampled together
SAMPLE_CHUNK = 256  # prompts sampled between saves of a round's work


def _heldout_reward(model, tok, prompts, rewards, max_new: int) -> float | None:
    if not prompts:
        return None
    gen = Generator(model, tok)
    outs = gen.complete_ids([p.ids for p in prompts], max_new_tokens=max_new, temperature=0)
    return sum(score(rewards, p.text, o.text, p.fields, p.messages)[0] for p, o in zip(prompts, outs)) / len(prompts)


def _sample_round(cfg: RFTConfig, n: int, current: str, gen, prompts, rewards, samples: Path, bad: list) -> None:
    """Round n's kept completions into `samples` (and its statistics into sampling.json beside it), a chunk
    of prompts at a time: an interrupted round continues where it stopped (posttrain/sampling_job.py)."""
    r = cfg.rft
    settings = {**input_settings(current, r.prompts, r.rewards, r.reward_weights), "samples": r.samples,
                "threshold": r.threshold, "max_new_tokens": r.max_new_tokens, "temperature": r.temperature,
                "seed": r.seed + n}

    def build(part, seed):
        errors: list[str] = []
        kept, stats = best_completions(gen, part, rewards, r.samples, r.threshold, errors, batch_rows=SAMPLE_ROWS,
                                       max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=seed)
        return kept, stats, errors

    job = SamplingJob(samples, settings, resume=None, restart_hint=f"remove {samples.parent} to sample round {n} again")
    with job.locked():
        state = job.run(prompts, build, r.samples, SAMPLE_CHUNK, SAMPLE_ROWS, r.seed + n, progress=cfg.log.progress)
    counts = state["counts"]
    if not counts.get("kept"):
        samples.unlink()
        raise DataError(f"round {n}: no sample kept (threshold {r.threshold}); lower it or sample more")
    atomic_write_json(samples.parent / "sampling.json",
                      {"samples": counts["samples"], "mean_reward": counts["reward_sum"] / max(1, counts["samples"]),
                       "kept": counts["kept"], "reward_errors": state["reward_failures"], "skipped_prompts": bad[:20]})


def rft(cfg: RFTConfig, out_dir: str | Path) -> list[dict]:
    """Run `cfg.rft.rounds` rounds into `out_dir` (finished rounds are reused); returns their records."""
    out = ensure_writable_dir(out_dir)
    r = cfg.rft
    rewards = load_rewards(r.rewards, r.reward_weights)
    if not r.prompts:
        raise DataError("no prompts: pass --prompts FILE... (prompt or messages records, + the fields rewards read)")
    history = read_json(out / ROUNDS_FILE, expect=list) if (out / ROUNDS_FILE).is_file() else []
    current = cfg.base
    for n in range(1, r.rounds + 1):
        round_dir = out / f"round_{n:02d}"
        run_dir = round_dir / "run"
        done = run_dir / SUMMARY_FILE
        if n <= len(history) and done.is_file():
            current = str(run_dir)
            continue
        model, tok = load_for_inference(current, device=cfg.train.device, merge=True)
        context = model.cfg.max_seq_len - r.max_new_tokens
        prompts, held, bad = read_prompts(r.prompts, tok, context)
        if r.eval_prompts:
            unmarked, marked, _ = read_prompts(r.eval_prompts, tok, context)
            held = unmarked + marked  # every prompt of an eval file is held out, marked split="heldout" or not
        held = held[: r.eval_count]
        samples = round_dir / "samples.jsonl"
        if not samples.is_file():
            _sample_round(cfg, n, current, Generator(model, tok), prompts, rewards, samples, bad)
        stats = read_json(round_dir / "sampling.json")
        before = _heldout_reward(model, tok, held, rewards, r.max_new_tokens)
        del model
        round_cfg = dataclasses.replace(cfg, base=str(current), sft=dataclasses.replace(cfg.sft, data=[str(samples)]))
        summary = sft(round_cfg, run_dir, resume=is_run_dir(run_dir))
        model, tok = load_for_inference(run_dir, device=cfg.train.device, merge=True)
        after = _heldout_reward(model, tok, held, rewards, r.max_new_tokens)
        record = {"round": n, "base": str(current), "samples": stats["samples"], "sample_reward": stats["mean_reward"],
                  "kept": stats["kept"], "heldout_reward_before": before, "heldout_reward_after": after,
                  "sft_steps": summary["steps"]}
        history = history[: n - 1] + [record]
        atomic_write_json(out / ROUNDS_FILE, history)
        print(f"round {n}: {stats['kept']:,} of {stats['samples']:,} samples kept (mean reward "
              f"{stats['mean_reward']:.3f}); held-out greedy reward {before} -> {after}")
        current = str(run_dir)
    return history
