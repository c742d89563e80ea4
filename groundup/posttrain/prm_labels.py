"""Step labels as Math-Shepherd makes them (Wang et al. 2023): a step is good when completions sampled
from it reach the right answer.

    records, counts = label_prompts(gen, tok, prompts, cfg.prm, correct, seed=0, index={id(p): i ...})
    state = label_job(out / STEP_LABELS_FILE, settings, gen, tok, prompts, cfg.prm, correct, seed)  # resumable

For each prompt, `solutions` solutions are sampled from the policy (through the one engine) and split
into steps (rewards/process_scorer.split_steps). For step i of a solution with S steps (i < S), the
prompt plus the solution's tokens up to step i's last one (process_scorer.step_tokens: the text
encoded whole, as the policy wrote it) is given to the policy, which samples N = `completions`
continuations; a continuation reaches the answer when the `correct` reward scores the solution text
so far plus it above 0. With `reached` of N right:
    hard estimation (HE)   label = 1 if reached > 0 else 0       (Math-Shepherd's default)
    soft estimation (SE)   label = reached / N
The last step has nothing left to complete: its label is whether the solution itself is right (as if
its N completions were the solution). A record keeps the steps, the labels, `reached` per step (null
for the last), whether the solution is right, and the prompt's fields (answer, split).

Seeds: the solutions of the prompt at position p (of the whole job) are sampled with seeds `seed + p *
solutions + j`, and the completions of its steps from a seed drawn from (seed, p), so a prompt's
labels do not depend on which chunk it falls in: a resumed job writes the same file as one that never
stopped (posttrain/sampling_job.py keeps the work chunk by chunk).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from groundup.errors import GroundupError
from groundup.posttrain.rollout import Prompt
from groundup.posttrain.sampling_job import SamplingJob
from groundup.rewards.functions import Reward, score_each
from groundup.rewards.process_scorer import split_steps, step_tokens


def step_label(reached: int, completions: int, estimation: str) -> float:
    """Math-Shepherd's estimate of a step from `reached` of `completions` continuations right."""
    if estimation == "hard":
        return 1.0 if reached > 0 else 0.0
    if estimation == "soft":
        return reached / completions
    raise ValueError(f"unknown estimation {estimation!r} (hard or soft)")


def _sample(gen, rows: list[list[int]], batch_rows: int, seed: int, **sampling) -> list:
    """Completions of `rows`, `batch_rows` at a time; row r is sampled with seed `seed + r`."""
    outs = []
    for i in range(0, len(rows), batch_rows):
        outs += gen.complete_ids(rows[i : i + batch_rows], **sampling, seed=seed + i)
    return outs


def _is_right(correct: Reward, p: Prompt, text: str, errors: list[str]) -> bool:
    s = score_each([correct], p.text, text, p.fields, p.messages)
    if s.errors:
        errors.append(f"{p.text[:60]!r}: {correct.name}: {s.errors[correct.name]}")
        return False
    return s.total > 0


def label_prompts(gen, tok, prompts: list[Prompt], prm, correct: Reward, seed: int, index: dict[int, int],
                  errors: list[str] | None = None) -> tuple[list[dict], dict]:
    """(one labelled record per sampled solution with at least one step, counts). `prm`: PRMSection
    (split, solutions, completions, estimation, max_new_tokens, temperature, batch_rows); `index[id(p)]`
    the prompt's position in the whole job (what its seeds derive from)."""
    errors = errors if errors is not None else []
    k, n = prm.solutions, prm.completions
    sampling = {"max_new_tokens": prm.max_new_tokens, "temperature": prm.temperature}
    records, counts = [], {"solutions": 0, "right": 0, "steps": 0, "good_steps": 0.0, "no_steps": 0,
                           "completions": 0}
    for p in prompts:
        at = index[id(p)]
        sols = _sample(gen, [p.ids] * k, prm.batch_rows, seed + at * k, **sampling)
        split = [split_steps(s.text, prm.split) for s in sols]
        rows, owners, prefixes = [], [], {}  # a row per completion of each step prefix: (solution, step)
        for j, steps in enumerate(split):
            tokens, ends = step_tokens(tok, steps)
            for i, end in enumerate(ends[:-1]):
                prefixes[(j, i)] = tok.decode(tokens[: end + 1])  # the solution's text up to the step's last token
                rows += [p.ids + tokens[: end + 1]] * n
                owners += [(j, i)] * n
        step_seed = int(np.random.default_rng([seed, at]).integers(1 << 31))
        outs = _sample(gen, rows, prm.batch_rows, step_seed, **sampling)
        reached: dict[tuple[int, int], int] = {}
        for (j, i), o in zip(owners, outs):
            text = prefixes[(j, i)] + o.text
            reached[(j, i)] = reached.get((j, i), 0) + _is_right(correct, p, text, errors)
        counts["completions"] += len(outs)
        fields = {key: v for key, v in p.fields.items() if key not in ("steps", "labels", "reached", "correct")}
        for j, steps in enumerate(split):
            counts["solutions"] += 1
            if not steps:
                counts["no_steps"] += 1
                continue
            right = _is_right(correct, p, sols[j].text, errors)
            got = [reached[(j, i)] for i in range(len(steps) - 1)]
            labels = [step_label(r, n, prm.estimation) for r in got] + [float(right)]
            counts["right"] += right
            counts["steps"] += len(steps)
            counts["good_steps"] += sum(labels)
            records.append({"prompt": p.messages if p.messages is not None else p.text, "steps": steps,
                            "labels": labels, "reached": got + [None], "completions": n, "correct": right,
                            **fields})
    return records, counts


class LabellingStopped(GroundupError):
    """A signal (SIGTERM, Ctrl-C) stopped the labelling between two chunks; the chunks done are kept."""


def labels_finished(out: str | Path) -> bool:
    """Whether a labelling job finished writing `out` (it exists, and no unfinished work is recorded)."""
    job = SamplingJob(out, {})
    return job.out.is_file() and not job.record.exists()


def label_job(out: str | Path, settings: dict, gen, tok, prompts: list[Prompt], prm, correct: Reward, seed: int,
              progress: bool = True, verb: str = "rm", stop: dict | None = None,
              resume_hint: str = "run it again") -> dict | None:
    """Label every prompt into `out` (JSONL), a chunk of `prm.chunk` prompts at a time, continuing an
    unfinished job at `out` that was started with the same `settings`; returns the job's record (counts
    summed over the whole job); None when `out` was finished before (it is left as it is). `stop`: a dict
    whose "signal" key, once set (the training session's signal handler), stops the job before its next
    chunk with LabellingStopped."""
    job = SamplingJob(out, settings, resume=None, what="step labels file", verb=verb,
                      restart_hint=f"delete {Path(out).name}.progress.json and {Path(out).name}.partial to start "
                                   "the labelling again")
    if labels_finished(out):  # finished before (a resumed run's training was stopped)
        return None
    index = {id(p): i for i, p in enumerate(prompts)}

    def build(part, _chunk_seed):
        if stop and stop.get("signal"):  # the training session's flag: stop between chunks, keeping them
            done = index[id(part[0])]
            raise LabellingStopped(f"{out}: labelling stopped by {stop['signal']} after {done:,} of {len(prompts):,} "
                                   f"prompts (kept); {resume_hint} to continue")
        errors: list[str] = []
        records, counts = label_prompts(gen, tok, part, prm, correct, seed, index, errors)
        return records, counts, errors

    def nothing(state):
        c = state["counts"]
        return (f"{c.get('solutions', 0):,} solutions sampled, {c.get('no_steps', 0):,} of them blank: no step "
                "to label")

    with job.locked():
        if job.state["prompts_done"]:
            print(f"{out}: resuming the step labels after {job.state['prompts_done']:,} of {len(prompts):,} prompts")
        try:
            # k = 1 and batch_rows = 1: a chunk is exactly prm.chunk prompts (the seeds never depend on it)
            return job.run(prompts, build, 1, prm.chunk, 1, seed, progress=progress, nothing=nothing)
        finally:
            job.print_failures()
