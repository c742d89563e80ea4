"""`groundup launch` and recovery: the commands, script and job each backend gets (read back by torchrun's own
parser, bash and Ray Train), train.auto_resume's choice of checkpoint, and the hang detector."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from safetensors.torch import load_file

from groundup.cli import main
from groundup.errors import ConfigError
from groundup.layout import step_name
from groundup.train import train
from groundup.train.hang import HANG_EXIT_CODE, parse_faults
from tests.train_helpers import env, metrics, shared_shards, tiny_config

VERB = ["train", "--config", "run.toml", "--out", "runs/big", "train.max_steps=50"]


def launch(capsys, *flags: str, verb=VERB) -> tuple[int, str, str]:
    code = main(["launch", *flags, "--dry-run", "--", *verb])
    out, err = capsys.readouterr()
    return code, out, err


def test_torchrun_command_per_node_parses_as_torchrun_reads_it(capsys):
    from torch.distributed.run import parse_args

    code, out, _ = launch(capsys, "--nodes", "2", "--gpus-per-node", "4", "--rdzv-endpoint", "node0:29400",
                          "--max-restarts", "5", "--job-id", "big7")
    assert code == 0
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    assert len(lines) == 2 and lines[0] == lines[1]  # every node runs the same line; c10d gives out node ranks
    argv = shlex.split(lines[0])
    assert argv[0] == "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"  # a store per attempt (pytorch/pytorch#135712)
    argv = argv[1:]
    assert argv[0] == "torchrun"
    args = parse_args(argv[1:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id,
            args.max_restarts, args.module, args.training_script) == \
        ("2", "4", "c10d", "node0:29400", "big7", 5, True, "groundup")
    assert args.training_script_args == [*VERB, "train.auto_resume=true"]


def test_one_node_rendezvous_locally_and_many_nodes_need_an_endpoint(capsys):
    from torch.distributed.run import parse_args

    code, out, _ = launch(capsys, "--gpus-per-node", "8")
    args = parse_args(shlex.split(out.splitlines()[1])[2:])
    assert (code, args.nnodes, args.rdzv_endpoint, args.rdzv_id, args.max_restarts) == \
        (0, "1", "localhost:0", "groundup-big", 3)
    code, _, err = launch(capsys, "--nodes", "3")
    assert code == 2 and "--nodes 3 with torchrun needs --rdzv-endpoint HOST:PORT" in err


def test_sbatch_script_runs_torchrun_per_node_with_the_first_host_as_rendezvous(capsys, tmp_path):
    code, out, _ = launch(capsys, "--backend", "slurm", "--nodes", "4", "--gpus-per-node", "8", "--max-restarts", "2")
    assert code == 0
    lines = out.splitlines()
    for expected in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                     "#SBATCH --requeue", 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
                     "MASTER_PORT=29500", "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        assert expected in lines
    srun = next(line for line in lines if line.startswith("srun "))
    argv = shlex.split(srun)  # the shell's quoting: the variables stay whole words
    torchrun = argv[argv.index("torchrun"):]
    assert torchrun[:3] == ["torchrun", "--nnodes", "$SLURM_NNODES"]
    assert torchrun[torchrun.index("--rdzv-endpoint") + 1] == "$MASTER_ADDR:$MASTER_PORT"
    assert torchrun[torchrun.index("--rdzv-id") + 1] == "$SLURM_JOB_ID"
    assert torchrun[torchrun.index("--max-restarts") + 1] == "2"
    assert torchrun[torchrun.index("-m"):] == ["-m", "groundup", *VERB, "train.auto_resume=true"]
    script = tmp_path / "launch.sbatch"
    script.write_text(out)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0  # bash reads it
    _, cpu, _ = launch(capsys, "--backend", "slurm", "--cpu", "--gpus-per-node", "4")
    assert "--gpus-per-node" not in cpu.split("srun")[0]  # a CPU job asks Slurm for no GPU


def test_ray_job_config_builds_the_torch_trainer(capsys):
    code, out, _ = launch(capsys, "--backend", "ray", "--nodes", "2", "--gpus-per-node", "4", "--max-restarts", "6",
                          "--address", "ray://head:10001", verb=[*VERB, "distributed.timeout_s=90"])
    job = json.loads(out)
    assert code == 0 and job["address"] == "ray://head:10001"
    assert job["scaling_config"] == {"num_workers": 8, "use_gpu": True, "resources_per_worker": {"CPU": 1, "GPU": 1}}
    assert job["failure_config"] == {"max_failures": 6}
    assert job["torch_config"] == {"backend": "nccl", "timeout_s": 90.0}
    assert job["run_config"]["name"] == "groundup-big" and job["run_config"]["storage_path"].endswith("runs/big/ray")
    assert job["train_loop_config"]["argv"] == [*VERB, "distributed.timeout_s=90", "train.auto_resume=true"]
    pytest.importorskip("ray.train")
    from groundup.launch.ray_job import build_trainer, train_loop_per_worker

    trainer = build_trainer(job)
    assert trainer.train_loop_per_worker is train_loop_per_worker
    assert (trainer.scaling_config.num_workers, trainer.scaling_config.use_gpu) == (8, True)
    assert trainer.run_config.failure_config.max_failures == 6
    assert (trainer.backend_config.backend, trainer.backend_config.timeout_s) == ("nccl", 90)


def test_launch_refuses_what_it_cannot_run(capsys):
    code, _, err = launch(capsys, verb=["generate", "--model", "m"])
    assert code == 2 and "'generate' is not a training verb" in err
    code, _, err = launch(capsys, verb=[])
    assert code == 2 and "nothing to launch" in err
    code, _, err = launch(capsys, "--gpus-per-node", "0")
    assert code == 2 and "gpus_per_node = 0: expected a positive integer" in err
    with pytest.raises(ConfigError, match="'kill:rank=1' is not kill:rank=R:step=S"):
        parse_faults("hang:rank=0:step=2,kill:rank=1")
    assert [(f.kind, f.rank, f.step) for f in parse_faults("kill:rank=2:step=7, hang:rank=1:step=5")] == \
        [("kill", 2, 7), ("hang", 1, 5)]


def _weights(run, step):
    return load_file(run / "checkpoints" / step_name(step) / "model.safetensors")


def test_auto_resume_takes_the_newest_intact_checkpoint_and_skips_a_corrupt_one(tmp_path_factory, tmp_path):
    shards = shared_shards(tmp_path_factory, "text", ("text",))[0]
    cfg = tiny_config(shards, "train.max_steps=6", "checkpoint.every=2", "train.auto_resume=true")
    ref = tmp_path / "ref"
    train(cfg, ref)  # auto_resume on an empty directory: a fresh run
    assert [e for e in metrics(ref)[1] if e["event"] == "resume"] == []

    again = tmp_path / "again"
    shutil.copytree(ref, again)
    (again / "checkpoints" / step_name(6) / "meta.json").unlink()  # half-written: never sealed
    (again / "checkpoints" / step_name(4) / "model.safetensors").write_bytes(b"torn")  # corrupt
    summary = train(cfg, again)  # the same command again: no --resume
    resumed = [e for e in metrics(again)[1] if e["event"] == "resume"]
    assert [(e["step"], e["from"]) for e in resumed] == [(2, step_name(2))]
    assert summary["steps"] == 6 and summary["session_steps"] == 4
    a, b = _weights(ref, 6), _weights(again, 6)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # Every checkpoint damaged: auto_resume starts the run again (without it, resume refuses)
    for step in (2, 4, 6):
        (again / "checkpoints" / step_name(step) / "meta.json").unlink()
    summary = train(cfg, again)
    assert summary["session_steps"] == 6
    b = _weights(again, 6)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_hang_detector_dumps_every_stack_and_exits_non_zero(tmp_path):
    code = textwrap.dedent(f"""
        import threading, time
        from groundup.train.hang import watch
        def stuck_helper():
            time.sleep(60)
        threading.Thread(target=stuck_helper, daemon=True).start()
        with watch({str(tmp_path)!r}, 3, 1.0) as step_done:
            step_done(0)
            step_done(1)
            time.sleep(60)  # a collective that never returns
    """)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60)
    took = time.monotonic() - started
    assert result.returncode == HANG_EXIT_CODE and took < 20
    dump = (tmp_path / "hang-rank3.txt").read_text()
    assert dump.startswith("groundup hang detector: rank 3 made no progress for 1.")
    assert "last finished step: 1" in dump
    assert "in stuck_helper" in dump and "in <module>" in dump  # every thread's stack, the stuck one included
    assert "stacks in" in result.stderr and str(tmp_path / "hang-rank3.txt") in result.stderr


def test_recovery_keys_are_validated_by_name():
    with pytest.raises(ConfigError, match=r"train.hang_timeout_s = -1.0: expected 0 \(off\)"):
        tiny_config("x", "train.hang_timeout_s=-1")
    with pytest.raises(ConfigError, match="distributed.timeout_s = 0.0: expected a positive number"):
        tiny_config("x", "distributed.timeout_s=0")
