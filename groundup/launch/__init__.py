"""`groundup launch`: one training verb on many processes and machines, restarted until it finishes.

    spec.py      the verb's argv (train.auto_resume appended), its run directory, the cluster's shape
    torchrun.py  a c10d-rendezvous torchrun command per node; one node runs it here
    slurm.py     an sbatch script: srun torchrun per node, the first host as rendezvous, --requeue
    ray_job.py   a Ray Train TorchTrainer job (ScalingConfig, FailureConfig, RunConfig)
    commands.py  `groundup launch`: the flags, --dry-run prints, otherwise runs or submits

Every backend runs the same verb with the same config into the same run directory; recovery is the
training core's (train.auto_resume, distributed.timeout_s, train.hang_timeout_s: train/hang.py).
"""

from groundup.launch.spec import LaunchSpec, launch_spec, run_verb

__all__ = ["LaunchSpec", "launch_spec", "run_verb"]
