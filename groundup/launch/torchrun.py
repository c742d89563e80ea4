"""torchrun with a c10d rendezvous: one command per node, run here when the job is one node.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29500
             --rdzv-id groundup-big --max-restarts 3 -m groundup train --config run.toml --out runs/big
             train.auto_resume=true

Every node runs the same command (c10d assigns node ranks at the rendezvous, which the first node's
agent hosts at --rdzv-endpoint). When a worker fails (killed, a hang detector's exit, a collective
that timed out), the agents stop the group and start it again, up to --max-restarts times; each new
attempt resumes from the newest intact checkpoint (train.auto_resume). One node without an endpoint
rendezvous on localhost with a port the OS picks, as `torchrun --standalone` does.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from groundup.errors import ConfigError
from groundup.launch.spec import DEFAULT_PORT, LaunchSpec

# Each attempt's process group gets a store of its own. By default (torch >= 2.5) the workers share the
# agent's rendezvous store across restarts, unprefixed, so a restarted gloo/NCCL group can read the dead
# attempt's addresses and hang or fail connecting (pytorch/pytorch#135712; seen here: a restarted 4-process
# gloo group stuck in connectFullMesh). Off, rank 0 hosts a fresh store on a free port every attempt.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchrun_argv(spec: LaunchSpec, program: tuple[str, ...] = ("torchrun",),
                  endpoint: str | None = None, rdzv_id: str | None = None) -> list[str]:
    """The command each node runs; `endpoint` / `rdzv_id` stand in for the spec's (the sbatch script's shell
    variables)."""
    endpoint = endpoint or spec.rdzv_endpoint
    if endpoint is None:
        if spec.nodes > 1:
            raise ConfigError(f"--nodes {spec.nodes} with torchrun needs --rdzv-endpoint HOST:PORT: the first node's "
                              f"address and a free port (e.g. node0:{DEFAULT_PORT}); every node's agent meets there",
                              key="rdzv_endpoint")
        endpoint = "localhost:0"  # one node: any free port (torchrun --standalone)
    return [*program, "--nnodes", str(spec.nodes), "--nproc-per-node", str(spec.gpus_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id or spec.run_id,
            "--max-restarts", str(spec.max_restarts), "-m", "groundup", *spec.verb_argv()]


def torchrun_commands(spec: LaunchSpec) -> list[str]:
    """One shell line per node (the same line: c10d gives out the node ranks)."""
    line = " ".join(f"{k}={v}" for k, v in TORCHRUN_ENV.items()) + " " + shlex.join(torchrun_argv(spec))
    return [f"# node {i} of {spec.nodes}\n{line}" for i in range(spec.nodes)]


def run_torchrun(spec: LaunchSpec) -> int:
    """One node: run torchrun here (this Python's torch.distributed.run) and pass its exit code on."""
    if spec.nodes > 1:
        raise ConfigError(f"--nodes {spec.nodes}: run the printed command on each node (--dry-run prints them), or "
                          "use --backend slurm or ray, which start every node", key="nodes")
    argv = torchrun_argv(spec, (sys.executable, "-m", "torch.distributed.run"))
    print(f"launch: {shlex.join(argv)}", flush=True)
    return subprocess.run(argv, env={**os.environ, **TORCHRUN_ENV}).returncode
