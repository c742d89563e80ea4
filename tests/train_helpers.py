"""Shared by the training tests: real token shards from a small corpus, and tiny run configs.

The tokenizer (vocab 384) and shards (~200K tokens of Shakespeare, stdlib code and math) are made by
the project's own tokenizer and `data tokenize`, once per test process (about 2 s).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from groundup.config import load_config
from groundup.corpus import chunk_text, generate_math_records, iter_shakespeare, iter_stdlib_code
from groundup.tokens.shards import TokenizeConfig, tokenize_to_shards
from groundup.tokenizer import TokenizerConfig, train_tokenizer
from groundup.train import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
_cache: dict[str, tuple[Path, Path]] = {}


def corpus(domains=("text", "code", "math")) -> list[dict]:
    records = []
    if "text" in domains:
        work = next(iter_shakespeare())
        records += [{**work, "id": f"{work['id']}#{i}", "text": c} for i, c in enumerate(chunk_text(work["text"], 3000))]
    if "code" in domains:
        records += list(itertools.islice(iter_stdlib_code(), 12))
    if "math" in domains:
        records += list(generate_math_records(150, seed=1))
    return records


def make_shards(root: Path, domains=("text", "code", "math"), vocab: int = 384, records=None) -> tuple[Path, Path]:
    """(shard directory, tokenizer directory) under `root`."""
    records = records if records is not None else corpus(domains)
    tok = train_tokenizer((r["text"] for r in records), TokenizerConfig(vocab_size=vocab), progress=False)
    tok_dir = tok.save(root / "tokenizer")
    src = root / "records.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({k: r[k] for k in ("id", "source", "domain", "text")}) + "\n")
    tokenize_to_shards([src], tok_dir, root / "shards", TokenizeConfig(workers=1, val_fraction=0.05), progress=False)
    return root / "shards", tok_dir


def shared_shards(tmp_path_factory, key: str = "all", domains=("text", "code", "math")) -> tuple[Path, Path]:
    if key not in _cache:
        _cache[key] = make_shards(tmp_path_factory.mktemp(f"shards-{key}"), domains)
    return _cache[key]


# A run that takes about a second: tiny model (d_model 64, 2 layers), 4 x 64 tokens per step.
TINY = ["train.batch_size=4", "train.seq_len=64", "train.threads=2", "schedule.peak_lr=2e-3",
        "log.every=1", "log.progress=false", "eval.every=0", "eval.max_batches=2", "checkpoint.every=4"]


def tiny_config(shards: Path, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, [f"data.shards={json.dumps(str(shards))}", *TINY, *overrides])


def metrics(run: Path) -> tuple[list[dict], list[dict]]:
    """(step lines, event lines) of a run's metrics.jsonl; evaluation lines are in neither."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "loss" in r and "event" not in r], [r for r in lines if "event" in r]


def assert_same_steps(run: Path, other: Path, step: int, weights: str = "model.safetensors") -> None:
    """Two runs took the same steps: the same losses and bit-identical weights at `step`."""
    import torch
    from safetensors.torch import load_file

    from groundup.layout import step_name

    a = load_file(run / "checkpoints" / step_name(step) / weights)
    b = load_file(other / "checkpoints" / step_name(step) / weights)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [s["loss"] for s in metrics(other)[0]] == [s["loss"] for s in metrics(run)[0]]


def assert_resumes_exactly(run: Path, resume: Callable[[Path], object], step: int,
                           weights: str = "model.safetensors") -> None:
    """A copy of finished `run` whose step-`step` checkpoint is made unusable, resumed by `resume(copy)` from
    the checkpoint before it, takes the same steps again."""
    from groundup.layout import step_name

    again = run.parent / f"{run.name}-resumed"
    shutil.copytree(run, again)
    (again / "checkpoints" / step_name(step) / "meta.json").unlink()
    resume(again)
    assert_same_steps(run, again, step, weights)


def write_config(path: Path, cfg: TrainConfig) -> Path:
    from groundup.config import save_config

    save_config(cfg, path)
    return path


def groundup_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "groundup", *args]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}


def run_cli(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run(groundup_cmd(*args), capture_output=True, text=True, env=env(), timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"groundup {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def one_process_fsdp(tmp_path_factory):
    """For a module fixture: a one-process FSDP2 Dist factory on a gloo group, and the shards."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from groundup.train.distributed import Dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    group = dist.new_group(backend="gloo")
    yield shared_shards(tmp_path_factory)[0], lambda: Dist(strategy="fsdp", mesh=mesh, ckpt_group=group)
    dist.destroy_process_group()
