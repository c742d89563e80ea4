"""A Ray Train job: a TorchTrainer whose workers each run the training verb, retried on failure.

    TorchTrainer(train_loop_per_worker, train_loop_config={"argv": [...]},
                 scaling_config=ScalingConfig(num_workers=NODES * GPUS, use_gpu=True, resources_per_worker=...),
                 torch_config=TorchConfig(backend="nccl", timeout_s=distributed.timeout_s),
                 run_config=RunConfig(storage_path=RUN/ray, name=RUN_ID, failure_config=FailureConfig(max_failures)))

Ray starts the workers and sets torch.distributed up in each (the process group, and RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in the environment, as torchrun does), so the
verb's init_distributed joins that group rather than making one. Each worker runs the verb in
process with train.auto_resume on; a worker that dies (killed, a hang detector's exit, a collective
that timed out) fails the attempt, and Ray starts a new worker group up to max_failures times, which
resumes from the run directory's newest intact checkpoint. Checkpoints stay groundup's own, in the
run directory (Ray's storage only keeps Ray's bookkeeping), so every backend resumes every other's.
Every node must see the run directory at the same path (a shared filesystem).

`--address` names a running cluster (ray://HOST:PORT, HOST:PORT or auto); without it the job runs
on a Ray instance started on this machine for it, with a CPU slot for every worker.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from groundup.launch.spec import LaunchSpec, collective_timeout, run_verb
from groundup.layout import RAY_STORAGE_DIR
from groundup.ray_cluster import import_ray, ray_session

ENTRY = "groundup.launch.ray_job:train_loop_per_worker"
PASSED_ENV = ("GROUNDUP_", "OMP_NUM_THREADS")  # environment the workers get from the launching shell


def ray_job_config(spec: LaunchSpec) -> dict:
    """Everything the job is built from, as plain data (what --dry-run prints)."""
    storage = Path(spec.storage) if spec.storage else spec.run_dir / RAY_STORAGE_DIR
    resources = {"CPU": 1} if spec.cpu else {"CPU": 1, "GPU": 1}
    return {
        "trainer": "ray.train.torch.TorchTrainer",
        "train_loop_per_worker": ENTRY,
        "train_loop_config": {"argv": spec.verb_argv(), "cwd": os.getcwd(),  # the verb's relative paths mean the same
                              "env": {k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV)}},
        "scaling_config": {"num_workers": spec.processes, "use_gpu": not spec.cpu, "resources_per_worker": resources},
        "torch_config": {"backend": "gloo" if spec.cpu else "nccl", "timeout_s": collective_timeout(spec.argv)},
        "run_config": {"storage_path": str(storage.resolve()), "name": spec.run_id},
        "failure_config": {"max_failures": spec.max_restarts},
        "address": spec.address,
    }


def train_loop_per_worker(config: dict) -> None:
    """One Ray Train worker: the verb, in this process, in the process group Ray set up. A non-zero exit
    fails the attempt (Ray retries it)."""
    os.environ.update(config.get("env") or {})
    os.chdir(config["cwd"])
    code = run_verb(list(config["argv"]))
    sys.stdout.flush()
    if code:
        raise RuntimeError(f"groundup {config['argv'][0]} exited with {code} on rank {os.environ.get('RANK')}")


def build_trainer(job: dict):
    """The TorchTrainer of `job` (ray_job_config's dict); needs Ray Train."""
    import_ray()
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        train_loop_per_worker, train_loop_config=job["train_loop_config"],
        scaling_config=ScalingConfig(**job["scaling_config"]),
        torch_config=TorchConfig(backend=job["torch_config"]["backend"],
                                 timeout_s=max(1, int(job["torch_config"]["timeout_s"]))),
        run_config=RunConfig(**job["run_config"], failure_config=FailureConfig(**job["failure_config"])))


def run_ray_job(spec: LaunchSpec) -> int:
    """Run the job on the cluster at --address (or a local Ray with a CPU per worker); 0 when it finished."""
    job = ray_job_config(spec)
    spec.claim_run_dir()
    if spec.address is None:  # a local instance, with a slot for every worker even on a small machine
        ray = import_ray()
        started = not ray.is_initialized()  # a caller's own connection is used and left as it is
        if started:
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, spec.processes), include_dashboard=False,
                     logging_level=logging.WARNING)
        try:
            return _fit(job)
        finally:
            if started:
                ray.shutdown()
    with ray_session(spec.address):
        return _fit(job)


def _fit(job: dict) -> int:
    Path(job["run_config"]["storage_path"]).mkdir(parents=True, exist_ok=True)
    trainer = build_trainer(job)
    try:
        trainer.fit()
    except Exception as e:  # noqa: BLE001 - Ray's TrainingFailedError and its relatives: the attempts ran out
        print(f"error: the Ray Train job failed after {job['failure_config']['max_failures']} retries: "
              f"{str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        return 1
    return 0

