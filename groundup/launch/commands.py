"""`groundup launch`: any training verb on N nodes x K processes, under torchrun, Slurm or Ray Train.

    groundup launch --nodes 1 --gpus-per-node 8 -- train --config run.toml --out runs/big
    groundup launch --nodes 4 --gpus-per-node 8 --rdzv-endpoint node0:29500 --dry-run -- sft ... --out runs/sft
    groundup launch --backend slurm --nodes 4 --gpus-per-node 8 -- train --config run.toml --out runs/big
    groundup launch --backend ray --address ray://head:10001 --nodes 4 --gpus-per-node 8 -- dpo ... --out runs/dpo
"""

from __future__ import annotations

import argparse
import json
import sys


def launch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=1, help="machines (default: 1)")
    p.add_argument("--gpus-per-node", type=int, default=1, metavar="K",
                   help="processes per machine, one per GPU (with --cpu, or on a machine without GPUs: processes "
                        "training on the CPU with gloo) (default: 1)")
    p.add_argument("--backend", choices=["torchrun", "slurm", "ray"], default="torchrun",
                   help="torchrun (this node runs it; more nodes: the command for each), slurm (an sbatch script, "
                        "submitted) or ray (a Ray Train TorchTrainer job) (default: torchrun)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, script or job config; start nothing")
    p.add_argument("--max-restarts", type=int, default=3, metavar="R",
                   help="new attempts after a failure, each resuming from the newest intact checkpoint (default: 3)")
    p.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="torchrun: the first node's address and a free port (needed for more than one node)")
    p.add_argument("--job-id", default=None, metavar="ID",
                   help="the rendezvous id / job name (default: groundup-RUNNAME; Slurm: the job id)")
    p.add_argument("--address", default=None,
                   help="ray: the cluster, ray://HOST:PORT, HOST:PORT or auto (default: a Ray started here)")
    p.add_argument("--storage", default=None, metavar="PATH", help="ray: RunConfig storage_path (default: RUN/ray)")
    p.add_argument("--cpu", action="store_true", help="workers need no GPU (slurm asks for none, ray schedules CPUs)")
    p.add_argument("verb", nargs=argparse.REMAINDER,
                   help="-- then the training verb and its arguments: train, sft, dpo, kto, grpo, rft, reward-model")


def launch(args: argparse.Namespace) -> int:
    from groundup.launch.ray_job import ray_job_config, run_ray_job
    from groundup.launch.slurm import sbatch_script, submit
    from groundup.launch.spec import launch_spec
    from groundup.launch.torchrun import run_torchrun, torchrun_commands

    argv = list(args.verb)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    spec = launch_spec(argv, nodes=args.nodes, gpus_per_node=args.gpus_per_node, backend=args.backend,
                       max_restarts=args.max_restarts, rdzv_endpoint=args.rdzv_endpoint, job_id=args.job_id,
                       address=args.address, storage=args.storage, cpu=args.cpu)
    if spec.backend == "torchrun":
        if args.dry_run or spec.nodes > 1:
            print("\n".join(torchrun_commands(spec)))
            if not args.dry_run:
                print(f"# run the line above on each of the {spec.nodes} nodes", file=sys.stderr)
            return 0
        return run_torchrun(spec)
    if spec.backend == "slurm":
        if args.dry_run:
            print(sbatch_script(spec), end="")
            return 0
        return submit(spec)
    if args.dry_run:
        print(json.dumps(ray_job_config(spec), indent=2))
        return 0
    return run_ray_job(spec)
