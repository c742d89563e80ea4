"""Expert parallelism (distributed.ep) on CPU with gloo, against one process with the same global batch.

One domain, so that P processes x 4/P sequences read exactly the 4 windows one process reads. The
model is a tiny MoE (4 experts, top-2, both layers MoE); 10 steps each.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from groundup.config import from_dict, load_config
from groundup.errors import ConfigError
from groundup.model.config import ModelConfig
from groundup.train import train
from groundup.train.config import TrainConfig
from groundup.train.expert_parallel import check_ep
from tests.train_helpers import TINY, env, metrics, shared_shards, tiny_config

STEPS = 10
MOE = ["model.n_experts=4", "model.moe_top_k=2"]
COMMON = [f"train.max_steps={STEPS}", "checkpoint.every=5", "eval.at_end=false", "data.domain_weights={text = 1.0}",
          *MOE]


def torchrun(n: int, run, *args: str) -> None:
    tiny = [o for o in TINY if not o.startswith(("train.batch_size", "train.threads"))]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
           "-m", "groundup", "train", "--out", str(run), *tiny, *COMMON, *args, f"train.batch_size={4 // n}",
           "train.threads=1", "--quiet"]
    result = subprocess.run(cmd, capture_output=True, text=True, env={**env(), "OMP_NUM_THREADS": "1"}, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    shards = shared_shards(tmp_path_factory)[0]
    run = tmp_path_factory.mktemp("ep") / "single"
    train(tiny_config(shards, *COMMON), run)
    return shards, run


def losses(run):
    return [s["loss"] for s in metrics(run)[0]]


def assert_same_run(run, ref):
    assert len(losses(run)) == STEPS
    assert losses(run) == pytest.approx(losses(ref), abs=1e-5)
    wa = load_file(run / "checkpoints" / f"step_{STEPS:07d}" / "model.safetensors")
    wb = load_file(ref / "checkpoints" / f"step_{STEPS:07d}" / "model.safetensors")
    assert wa.keys() == wb.keys() and wa["blocks.0.mlp.experts_in"].shape[0] == 4  # whole stacks, plain names
    # Adam divides by the gradient's own scale, so a weight whose gradient is near zero carries the
    # summation-order rounding of the all-to-all's regrouped rows into its update: 1e-4 is 1/20 of one step.
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-4, rtol=1e-4)


def assert_balance_logged(run, processes: int, ep: int):
    """Per process: tokens routed to each expert by its data, and received by each of its experts."""
    tokens = 4 // processes * 64 * 2 * 2  # sequences x length x top_k x MoE layers, per step and process
    for step in metrics(run)[0]:
        routed, received = step["ep_tokens_routed"], step["ep_tokens_received"]
        assert len(routed) == len(received) == processes
        assert all(len(r) == 4 and sum(r) == tokens for r in routed)
        assert all(len(r) == 4 // ep for r in received)
        # what each process received is what the processes of its ep group routed to its experts
        for p in range(processes):
            group = range(p - p % ep, p - p % ep + ep)
            local = p % ep
            mine = range(local * 4 // ep, (local + 1) * 4 // ep)
            assert received[p] == [sum(routed[q][e] for q in group) for e in mine]
        assert step["ep_imbalance"] == pytest.approx(
            [max(r) / (sum(r) / len(r)) for r in received], rel=1e-5)
        assert step["ep_dropped_tokens"] == 0 and step["ep_aux_loss"] == [0.0] * processes


def test_two_processes_ddp_expert_parallel_matches_one_process(single, tmp_path):
    shards, ref = single
    run = tmp_path / "ep2"
    torchrun(2, run, f"data.shards={shards}", "distributed.ep=2")
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["strategy"], summary["processes"]) == ("ddp", 2)
    assert_same_run(run, ref)
    assert_balance_logged(run, 2, 2)
    meta = json.loads((run / "checkpoints" / f"step_{STEPS:07d}" / "meta.json").read_text())
    assert meta["sharded"]["processes"] == 2  # expert shards: a DCP checkpoint


def test_four_processes_fsdp_with_two_expert_replicas_matches_one_process(single, tmp_path):
    """FSDP2 over 4 processes, experts split over 2 and replicated twice (their gradients summed over the copies)."""
    shards, ref = single
    run = tmp_path / "ep2x2"
    torchrun(4, run, f"data.shards={shards}", "distributed.strategy=fsdp", "distributed.ep=2")
    assert_same_run(run, ref)
    assert_balance_logged(run, 4, 2)


@pytest.mark.parametrize("overrides, ep, processes, words", [
    ({"n_experts": 4}, 2, 3, "distributed.ep = 2 must divide the number of processes (3)"),
    ({"n_experts": 6}, 4, 4, "distributed.ep = 4 must divide model.n_experts (6)"),
    ({}, 2, 4, "with a dense model"),
])
def test_layouts_expert_parallelism_cannot_have_name_the_key(overrides, ep, processes, words):
    cfg = from_dict(ModelConfig, {"preset": "tiny", **overrides})
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        check_ep(cfg, ep, processes)
    assert e.value.key == "distributed.ep"
    with pytest.raises(ConfigError, match="ep = 2: expected 1 when distributed.tp > 1") as e:
        load_config(TrainConfig, None, ["distributed.strategy=fsdp", "distributed.tp=2", "distributed.ep=2"])
    assert e.value.key.endswith("ep")
