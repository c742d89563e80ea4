"""Records made from a model's samples (`groundup data pairs`, each `groundup rft` round), written as a
job that never loses finished work.

    job = SamplingJob(out, settings, resume=False, overwrite=False)   # checks what is already at OUT
    with job.locked():
        state = job.run(prompts, build, k=8, chunk=256, batch_rows=32, seed=0, nothing=explain)
    # build(prompts, seed) -> (records, counts, errors): one chunk's records, its counts (summed over the
    # run in state["counts"]) and its reward failures; explain(state) -> why no record was made

The prompts are sampled a chunk at a time. Each chunk's records are appended to `OUT.partial` and
flushed to disk, then `OUT.progress.json` records how many prompts are done and how long the partial
file is, so a crash, a kill or Ctrl-C loses at most the chunk in flight. A resumed run continues from
that record (a partial file longer than recorded, a half-written chunk, is cut back first) after
checking that the model, prompt files and sampling settings are the ones it was started with. The
finished file is the same bytes as one uninterrupted run: every sampling batch's seed is the run's
seed plus the batch's first row, and a chunk holds whole batches. When every prompt is done,
`OUT.partial` becomes OUT in one rename (an OUT already there is only replaced then, with
`overwrite`) and the record is removed. One process writes an OUT at a time (`.OUT.lock` beside it).

Nothing usable is never written: a run whose prompts gave no record at all leaves no OUT (and no
partial file or record) and says why (`nothing`); so does a run stopped because its rewards never
work (RewardsBroken: the chunks done were scored by them, so they are not kept to resume), and a run
that fails inside its first chunk (nothing finished, nothing to resume). An OUT
that is a directory is refused before any work.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

from groundup.data.input_tasks import input_fingerprint
from groundup.errors import DataError
from groundup.io import atomic_write_json, read_json, writer_lock
from groundup.layout import claim_output_file, resolve_model_dir
from groundup.rewards.health import RewardsBroken

PROGRESS_VERSION = 1
MAX_FAILURE_EXAMPLES = 20  # reward failures kept verbatim in the record (all of them are counted)


def input_settings(model: str | Path, prompts, rewards: list[str], weights: list[float]) -> dict:
    """The inputs a resumed job must share with the one it continues: the model's and prompt files'
    fingerprints (path, size, modification time) and the rewards with their weights."""

    return {"model": input_fingerprint([resolve_model_dir(model, note=lambda _: None)])[0],
            "prompts": input_fingerprint([Path(f) for f in prompts]), "rewards": list(rewards),
            "reward_weights": list(weights)}


def chunk_prompts(target: int, k: int, batch_rows: int) -> int:
    """The prompts of a chunk: at least `target`, rounded up so that a chunk's k x prompts rows fill whole
    sampling batches (what keeps a chunked run's samples identical to an unchunked one)."""
    unit = batch_rows // math.gcd(k, batch_rows)
    return unit * max(1, -(-target // unit))


class SamplingJob:
    def __init__(self, out: str | Path, settings: dict, resume: bool | None = False, overwrite: bool = False,
                 restart_hint: str = "start again with --overwrite", what: str = "file", verb: str = "data pairs"):
        self.out, self.what, self.verb = Path(out), what, verb
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.record = self.out.with_name(self.out.name + ".progress.json")
        self.settings, self.resume, self.overwrite, self.restart_hint = settings, resume, overwrite, restart_hint

    @contextlib.contextmanager
    def locked(self):
        """Hold the output's lock, then decide (under it) whether this run starts afresh or continues."""
        lock = f".{self.out.name}.lock"
        with writer_lock(self.out.parent, lock):
            try:
                self.state = self._start()
                yield self
            finally:
                if not self.record.exists() and not self.partial.exists():  # nothing unfinished: no lock file left
                    (self.out.parent / lock).unlink(missing_ok=True)

    def _fresh(self) -> dict:
        return {"version": PROGRESS_VERSION, "settings": self.settings, "prompts_done": 0, "bytes": 0, "counts": {},
                "reward_failures": 0, "failure_examples": []}

    def _start(self) -> dict:
        claim_output_file(self.out, self.verb, self.what)  # a folder is found now, not by the rename at the end
        if self.partial.exists() and not self.record.exists():  # stopped inside its first chunk: nothing was finished
            self.partial.unlink()
        if self.resume or (self.resume is None and self.record.exists()):  # None: continue whatever is unfinished
            return self._continue()
        if self.record.exists():
            if not self.overwrite:
                done = self._peek_done()
                raise DataError(f"{self.out}: an unfinished run is here ({done} prompts done, {self.record.name}): "
                                "pass --resume to continue it or --overwrite to start again")
        elif self.out.exists() and not self.overwrite:
            raise DataError(f"{self.out} already exists: choose another --out or pass --overwrite")
        self.partial.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)
        return self._fresh()

    def _peek_done(self) -> str:
        try:
            return f"{int(read_json(self.record, dict)['prompts_done']):,}"
        except Exception:
            return "an unknown number of"

    def _continue(self) -> dict:
        if not self.record.exists():
            raise DataError(f"{self.out}: nothing to resume ({self.record.name} not found); run without --resume")
        state = read_json(self.record, dict)
        if state.get("version") != PROGRESS_VERSION or not isinstance(state.get("settings"), dict):
            raise DataError(f"{self.record}: not a progress record of this version of groundup; {self.restart_hint}")
        _check_progress_types(self.record, state, self.restart_hint)
        changed = [k for k in sorted(set(state["settings"]) | set(self.settings))
                   if state["settings"].get(k) != self.settings.get(k)]
        if changed:
            lines = "; ".join(f"{k}: {state['settings'].get(k)!r} -> {self.settings.get(k)!r}" for k in changed)
            raise DataError(f"{self.out}: cannot resume, the run was started with other settings ({lines}); "
                            f"use the same ones or {self.restart_hint}")
        have = self.partial.stat().st_size if self.partial.exists() else -1
        if have < state["bytes"]:
            raise DataError(f"{self.partial}: {max(have, 0):,} bytes where {self.record.name} records "
                            f"{state['bytes']:,}; the partial file was changed: {self.restart_hint}")
        if have > state["bytes"]:  # a chunk was being written when the run stopped: drop it, it is redone
            os.truncate(self.partial, state["bytes"])
        return state

    def run(self, prompts: list, build, k: int, chunk: int, batch_rows: int, seed: int, progress: bool = True,
            nothing=lambda state: "no prompt gave a record") -> dict:
        """Sample the prompts not done yet, chunk by chunk (`build(part, seed)` samples and scores one);
        returns the final record, counts summed over the whole run, resumed parts included. No record
        at all: nothing is left at OUT and DataError says why (`nothing(state)`)."""
        try:
            state = self._sample(prompts, build, k, chunk, batch_rows, seed, progress)
        except RewardsBroken:
            self._discard()
            raise
        except Exception:
            if not self.state["prompts_done"]:  # stopped in its first chunk: nothing to resume, nothing left behind
                self._discard()
            raise
        if not state["bytes"]:
            self._discard()
            raise DataError(f"{self.out}: nothing written: {nothing(state)}")
        os.replace(self.partial, self.out)
        self.record.unlink()
        return state

    def print_failures(self, label: str = "reward failure") -> None:
        """The failures kept verbatim (the first MAX_FAILURE_EXAMPLES), resumed parts included, each after `label`."""
        for example in self.state.get("failure_examples", []):
            print(f"{label}: {example}")

    def _discard(self) -> None:
        self.partial.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)

    def _sample(self, prompts: list, build, k: int, chunk: int, batch_rows: int, seed: int, progress: bool) -> dict:
        from tqdm import tqdm

        state, size = self.state, chunk_prompts(chunk, k, batch_rows)
        with open(self.partial, "ab") as f, tqdm(total=len(prompts), initial=state["prompts_done"], unit=" prompts",
                                                  desc=self.out.name, disable=not progress) as bar:
            for start in range(state["prompts_done"], len(prompts), size):
                part = prompts[start : start + size]
                records, counts, errors = build(part, seed + start * k)
                f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
                room = max(MAX_FAILURE_EXAMPLES - len(state["failure_examples"]), 0)
                state.update(prompts_done=start + len(part), bytes=f.tell(),
                             counts={key: state["counts"].get(key, 0) + counts.get(key, 0)
                                     for key in {**state["counts"], **counts}},
                             reward_failures=state["reward_failures"] + len(errors),
                             failure_examples=state["failure_examples"] + errors[:room])
                atomic_write_json(self.record, state)
                bar.update(len(part))
        return state


_PROGRESS_TYPES = {"prompts_done": int, "bytes": int, "counts": dict, "reward_failures": int, "failure_examples": list}


def _check_progress_types(path, state: dict, hint: str) -> None:
    """A progress record edited or damaged into other types is one line naming the key, never a traceback."""
    for key, kind in _PROGRESS_TYPES.items():
        value = state.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            want = "a whole number >= 0" if kind is int else f"a JSON {'object' if kind is dict else 'array'}"
            raise DataError(f"{path}: key {key!r} = {value!r}: expected {want}; {hint}")
    bad = [k for k, v in state["counts"].items() if not isinstance(v, (int, float)) or isinstance(v, bool)]
    if bad:
        raise DataError(f"{path}: key 'counts.{bad[0]}' = {state['counts'][bad[0]]!r}: expected a number; {hint}")

