"""What every backend launches: one training verb's command line, its run directory, and the cluster's shape.

    spec = launch_spec(["train", "--config", "run.toml", "--out", "runs/big"], nodes=2, gpus_per_node=8)
    spec.verb_argv()   # ["train", "--config", "run.toml", "--out", "runs/big", "train.auto_resume=true"]

The verb's own parser reads its arguments (so `--out D`, `--out=D` and `--resume D` all name the run
directory the same way), and every backend runs the very same argv with `train.auto_resume=true`
appended: a restarted attempt, a requeued Slurm job or a retried Ray worker group continues from the
newest intact checkpoint, in the same run directory, with the same config. `run_verb(argv)` runs a
verb in this process the way the CLI does (a Ray Train worker, where torch.distributed is set up).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from groundup.arguments import resolve_output
from groundup.config import fail
from groundup.errors import ConfigError, GroundupError
from groundup.layout import claim_output_dir
from groundup.posttrain import commands as post
from groundup.train import commands as pre
from groundup.train.config import DistributedConfig

BACKENDS = ("torchrun", "slurm", "ray")
AUTO_RESUME = "train.auto_resume=true"
DEFAULT_PORT = 29500  # torchrun's default rendezvous port
# The training verbs (their handler and their parser), as cli.COMMANDS names them; "rm" is reward-model's old name
TRAINING_VERBS: dict[str, tuple[Callable, Callable]] = {
    "train": (pre.train, pre.train_arguments), "sft": (post.sft, post.sft_arguments),
    "dpo": (post.dpo, post.dpo_arguments), "kto": (post.kto, post.kto_arguments),
    "grpo": (post.grpo, post.grpo_arguments), "rft": (post.rft, post.rft_arguments),
    "reward-model": (post.reward_model, post.reward_model_arguments),
    "rm": (post.reward_model, post.reward_model_arguments),
}


@dataclass(frozen=True)
class LaunchSpec:
    argv: tuple[str, ...]  # the verb and its arguments, as given after `--`
    run_dir: Path  # the verb's --out (or --resume) directory
    nodes: int = 1
    gpus_per_node: int = 1  # processes per node (on CPUs: processes, each training on the CPU with gloo)
    backend: str = "torchrun"
    max_restarts: int = 3  # attempts after a failure: torchrun --max-restarts, Ray FailureConfig(max_failures)
    rdzv_endpoint: str | None = None  # HOST:PORT of the rendezvous (the first node); one node: a free local port
    job_id: str | None = None  # the rendezvous id (torchrun), $SLURM_JOB_ID (Slurm), the run name (Ray)
    address: str | None = None  # Ray: the cluster (ray://HOST:PORT, HOST:PORT or auto); None: a local one
    storage: str | None = None  # Ray: RunConfig storage_path; None: RUN/ray
    cpu: bool = False  # workers need no GPU (Slurm asks for none, Ray schedules CPUs)

    @property
    def verb(self) -> str:
        return self.argv[0]

    @property
    def processes(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def run_id(self) -> str:
        """The rendezvous / run name: --job-id, else derived from the run directory (the same on every node)."""
        if self.job_id:
            return self.job_id
        name = "".join(c if c.isalnum() or c in "-_" else "-" for c in self.run_dir.resolve().name)
        return f"groundup-{name}"

    def claim_run_dir(self) -> None:
        """Before a backend writes into the run directory (the sbatch script, Ray's storage): refuse another
        verb's folder, as the verb itself would."""
        claim_output_dir(self.run_dir, "rm" if self.verb == "reward-model" else self.verb, resume=True)

    def verb_argv(self) -> list[str]:
        """What each process runs after `-m groundup`: the verb's argv with train.auto_resume on."""
        argv = list(self.argv)
        return argv if AUTO_RESUME in argv else [*argv, AUTO_RESUME]


def verb_parser(verb: str) -> argparse.ArgumentParser:
    if verb not in TRAINING_VERBS:
        known = ", ".join(v for v in TRAINING_VERBS if v != "rm")
        raise ConfigError(f"'groundup launch -- {verb} ...': {verb!r} is not a training verb; expected one of {known}",
                          key="verb")
    parser = argparse.ArgumentParser(prog=f"groundup {verb}", add_help=False)
    TRAINING_VERBS[verb][1](parser)
    return parser


def parse_verb(argv: list[str]) -> argparse.Namespace:
    """The verb's arguments as its own parser reads them (trailing key=value overrides included)."""
    if not argv:
        raise ConfigError("nothing to launch: give the training verb after '--', e.g. 'groundup launch --nodes 2 "
                          "--gpus-per-node 8 -- train --config run.toml --out runs/big'", key="verb")
    parser = verb_parser(argv[0])
    try:
        args, extra = parser.parse_known_args(argv[1:])
    except SystemExit:  # argparse printed the reason
        raise ConfigError(f"the arguments of '{argv[0]}' do not parse: {' '.join(argv[1:])}", key="verb") from None
    if extra and (not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra)):
        raise ConfigError(f"'{argv[0]}': unrecognized arguments: {' '.join(extra)}", key="verb")
    args.overrides = list(getattr(args, "overrides", None) or []) + extra
    return args


def launch_spec(argv: list[str], **shape) -> LaunchSpec:
    """The spec of launching `argv` (a training verb and its arguments) with `shape` (LaunchSpec's fields)."""
    args = parse_verb(list(argv))
    run_dir, _ = resolve_output(args)
    spec = LaunchSpec(tuple(argv), run_dir, **shape)
    for key in ("nodes", "gpus_per_node"):
        if getattr(spec, key) < 1:
            fail(key, getattr(spec, key), "a positive integer")
    if spec.max_restarts < 0:
        fail("max_restarts", spec.max_restarts, "an integer >= 0")
    if spec.backend not in BACKENDS:
        fail("backend", spec.backend, " or ".join(BACKENDS))
    if spec.rdzv_endpoint is not None:
        host, _, port = spec.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            fail("rdzv_endpoint", spec.rdzv_endpoint, "HOST:PORT (the first node's address and a free port)")
    return spec


def collective_timeout(argv: list[str]) -> float:
    """distributed.timeout_s of the verb's command line (its override, else its --config file's, else the
    default): Ray Train sets up the process group itself, so it must be handed this value."""
    args = parse_verb(list(argv))
    value = None
    for override in args.overrides:
        key, _, raw = override.partition("=")
        if key.strip() == "distributed.timeout_s":
            value = raw
    if value is None and getattr(args, "config", None) is not None:
        try:
            value = tomllib.loads(Path(args.config).read_text()).get("distributed", {}).get("timeout_s")
        except (OSError, ValueError):
            value = None  # the verb reports its own config file's problem
    try:
        return float(value) if value is not None else DistributedConfig.timeout_s
    except ValueError:
        fail("distributed.timeout_s", value, "a positive number of seconds")


def run_verb(argv: list[str]) -> int:
    """Run a training verb in this process as `groundup VERB ...` does; its exit code."""
    args = parse_verb(list(argv))
    run = TRAINING_VERBS[argv[0]][0]
    try:
        return int(run(args) or 0)
    except GroundupError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
