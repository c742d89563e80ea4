"""Rewards that never work stop the run: a reward that fails on every call, or rewards that never tell
the samples of a prompt apart, teach nothing, and a run that goes on regardless exits 0 having learned
nothing. GRPO (per optimizer step), `rft` and `data pairs` (per sampling batch) feed each batch's
tally here and stop with `RewardsBroken`, saying why, after `patience` batches:

    health = RewardHealth(["code", "format_answer"], patience=5, unit="steps", knob="grpo.reward_patience")
    health.update(BatchTally(samples=32, failed={"code": 32}, varied=0, reward_sum=6.0, errors={"code": "..."}))

- a reward that failed on every one of its calls in each of the last `patience` batches (a reward that
  works now and then is not stopped: its failures are counted and shown);
- every prompt's samples scored alike in each of the first `patience` batches of the run (nothing to
  learn from, or to rank); once the rewards have told one prompt's samples apart, this no longer applies,
  so a policy that later solves every prompt is not stopped.
`patience = 0` turns both off. The counters are part of a run's state (`state_dict`), so a resumed run
stops where an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from groundup.errors import DataError


class RewardsBroken(DataError):
    """The rewards cannot teach this run anything: a reward fails on every call, or none ever varies."""


@dataclass
class BatchTally:
    samples: int = 0  # completions scored
    failed: dict[str, int] = field(default_factory=dict)  # reward name -> calls that failed
    varied: int = 0  # prompts whose samples did not all score the same
    reward_sum: float = 0.0  # of the samples' totals
    errors: dict[str, str] = field(default_factory=dict)  # reward name -> the first failure's reason

    def add(self, other: "BatchTally") -> None:
        self.samples += other.samples
        self.varied += other.varied
        self.reward_sum += other.reward_sum
        for name, n in other.failed.items():
            self.failed[name] = self.failed.get(name, 0) + n
        for name, why in other.errors.items():
            self.errors.setdefault(name, why)

    def as_list(self, names: list[str]) -> list[float]:
        """The numbers, in a fixed order, to sum over processes (then `from_list`)."""
        return [self.samples, self.varied, self.reward_sum, *[self.failed.get(n, 0) for n in names]]

    @classmethod
    def from_list(cls, values: list[float], names: list[str], errors: dict[str, str]) -> "BatchTally":
        samples, varied, reward_sum, *failed = values
        return cls(int(samples), {n: int(f) for n, f in zip(names, failed)}, int(varied), float(reward_sum), errors)


class RewardHealth:
    def __init__(self, names: list[str], patience: int, unit: str, knob: str):
        self.names, self.patience, self.unit, self.knob = list(names), patience, unit, knob
        self.failing = {n: 0 for n in self.names}  # consecutive batches a reward failed on every call
        self.flat = 0  # batches since the start whose prompts all scored alike; -1 once one did not

    def update(self, tally: BatchTally) -> None:
        """Count one batch; RewardsBroken once a reward failed on every call of `patience` batches in a row,
        or every prompt of the first `patience` batches scored alike."""
        if tally.samples == 0:
            return
        for name in self.names:
            self.failing[name] = self.failing[name] + 1 if tally.failed.get(name, 0) >= tally.samples else 0
        if self.flat >= 0:
            self.flat = -1 if tally.varied else self.flat + 1
        if not self.patience:
            return
        stop = f"fix it, or set {self.knob} to never stop"
        for name in self.names:
            if self.failing[name] >= self.patience:
                why = tally.errors.get(name, "see the failures reported by the other processes")
                raise RewardsBroken(f"reward {name!r} failed on every call of the last {self.patience} {self.unit} "
                                    f"({why}): it can teach nothing; {stop}")
        if self.flat >= self.patience:
            raise RewardsBroken(f"every prompt's completions scored alike in the first {self.patience} {self.unit} "
                                f"(mean reward {tally.reward_sum / tally.samples:g}): there is nothing to learn from; "
                                f"check the rewards and the record fields they read, or set {self.knob} to never stop")

    def varied_before(self) -> None:
        """The rewards told some prompt's samples apart in work this run continues (a resumed job)."""
        self.flat = -1

    def state_dict(self) -> dict:
        return {"failing": dict(self.failing), "flat": self.flat}

    def load_state_dict(self, state: dict) -> None:
        self.failing = {n: int(state.get("failing", {}).get(n, 0)) for n in self.names}
        self.flat = int(state.get("flat", 0))
