"""A Slurm batch script: one task per node, each running torchrun; requeued when a node fails.

    #SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 --requeue
    MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
    srun torchrun --nnodes "$SLURM_NNODES" ... --rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id "$SLURM_JOB_ID" ...

The first host of the allocation hosts the c10d rendezvous; the job id names it, so a requeued job
(same id, maybe other nodes) meets again and resumes the run (train.auto_resume). Worker failures
inside the allocation are torchrun's (--max-restarts); a node that fails ends the job step, and
--requeue puts the job back in the queue. The script is written to RUN/launch.sbatch and submitted
with sbatch; its output goes to RUN/slurm-JOBID.out.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from groundup.errors import ConfigError, DataError
from groundup.io import atomic_write_text
from groundup.launch.spec import DEFAULT_PORT, LaunchSpec
from groundup.launch.torchrun import TORCHRUN_ENV, torchrun_argv
from groundup.layout import SLURM_SCRIPT_FILE


def sbatch_script(spec: LaunchSpec, workdir: Path | None = None) -> str:
    """The batch script's text; `workdir`: where the job starts (default: this directory)."""
    workdir = (workdir or Path.cwd()).resolve()
    run_dir = spec.run_dir if spec.run_dir.is_absolute() else workdir / spec.run_dir
    port = spec.rdzv_endpoint.rpartition(":")[2] if spec.rdzv_endpoint else str(DEFAULT_PORT)
    # The shell fills these in on the node: quoted so that shlex.join leaves them for it
    argv = torchrun_argv(spec, endpoint="@ENDPOINT@", rdzv_id="@RDZV_ID@")
    argv[argv.index("--nnodes") + 1] = "@NNODES@"
    command = (shlex.join(argv).replace("@ENDPOINT@", '"$MASTER_ADDR:$MASTER_PORT"')
               .replace("@RDZV_ID@", shlex.quote(spec.job_id) if spec.job_id else '"$SLURM_JOB_ID"').replace("@NNODES@", '"$SLURM_NNODES"'))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={spec.run_id}",
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([] if spec.cpu else [f"#SBATCH --gpus-per-node={spec.gpus_per_node}"]),
        "#SBATCH --requeue",
        f"#SBATCH --chdir={workdir}",
        f"#SBATCH --output={run_dir}/slurm-%j.out",
        "#SBATCH --open-mode=append",
        "set -euo pipefail",
        "# The first node of the allocation hosts the rendezvous; the job id names it (the same after a requeue)",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"MASTER_PORT={port}",
        "export MASTER_ADDR MASTER_PORT",
        *(f"export {k}={v}" for k, v in TORCHRUN_ENV.items()),  # each restart's group gets a store of its own
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {command}",
        "",
    ]
    return "\n".join(lines)


def submit(spec: LaunchSpec) -> int:
    """Write RUN/launch.sbatch and submit it with sbatch; sbatch's exit code."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigError("--backend slurm: sbatch is not on PATH (run on a Slurm login node, or --dry-run to print "
                          "the script)", key="backend")
    spec.claim_run_dir()
    path = spec.run_dir / SLURM_SCRIPT_FILE
    try:
        spec.run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"{spec.run_dir}: cannot create the run directory ({e.strerror or e})") from None
    atomic_write_text(path, sbatch_script(spec))
    print(f"launch: wrote {path}", flush=True)
    return subprocess.run([sbatch, str(path)]).returncode
