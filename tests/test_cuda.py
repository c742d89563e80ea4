"""On a CUDA GPU: training, attention and the engine run there and agree with the CPU.

Marked `cuda`: they skip without a GPU, and benchmarks/gpu_check.py runs them (`pytest -m cuda`) whenever
one is at hand. Tiny models; each test takes seconds.
"""

from __future__ import annotations

import pytest
import torch

from groundup.config import from_dict
from groundup.infer import Generator
from groundup.train.config import TrainConfig
from groundup.train.distributed import Dist
from groundup.train.objective import NextTokenObjective
from groundup.train.state import build_state
from groundup.train.step import train_step
from infer_helpers import small_tokenizer, tiny_model

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TINY = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192, max_seq_len=64,
            tie_embeddings=True)


class FixedBatches:
    """The same sequence of random token windows on every run (CPU tensors; the step moves them)."""

    def __init__(self, seed: int = 0):
        self.gen = torch.Generator().manual_seed(seed)

    def __next__(self):
        from groundup.tokens.loader import Batch

        x = torch.randint(0, TINY["vocab_size"], (4, 33), generator=self.gen)
        return Batch(x[:, :-1], x[:, 1:], [[0]] * 4, ["random"] * 4)

    def document_names(self, docs):
        return [str(d) for d in docs]


def losses(device: str, precision: str, optimizer: str, steps: int = 4) -> list[float]:
    cfg = from_dict(TrainConfig, {
        "model": {"name": "t", **TINY}, "train": {"batch_size": 4, "seq_len": 32, "device": device},
        "optim": {"name": optimizer}, "precision": {"mode": precision},
        "schedule": {"warmup_steps": 0, "peak_lr": 1e-3}, "stability": {"spike_factor": 0.0}})
    state = build_state(cfg, Dist(device=torch.device(device)), NextTokenObjective(cfg), FixedBatches())
    out = []
    for _ in range(steps):
        out.append(train_step(state).loss)
        state.step += 1
    return out


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_training_on_cuda_follows_the_cpu_run(optimizer, monkeypatch):
    """fp32 on the GPU (TF32 off) takes the CPU's steps; bf16 autocast stays within bf16's rounding."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    cpu = losses("cpu", "fp32", optimizer)
    assert losses("cuda", "fp32", optimizer) == pytest.approx(cpu, abs=2e-4)
    assert losses("cuda", "bf16-autocast", optimizer) == pytest.approx(cpu, abs=5e-2)


def test_flash_attention_runs_the_training_forward_and_backward():
    """With only the flash backend allowed, the bf16 forward and backward still run: our attention hands
    SDPA what flash accepts (no explicit mask for causal attention, contiguous heads)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = tiny_model(max_seq_len=64).cuda().train()
    ids = torch.randint(0, 512, (2, 64), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(ids).logits
    logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("compile", [False, True])
def test_the_engine_on_cuda_decodes_the_cpu_engines_tokens(compile, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    tok = small_tokenizer()
    model = tiny_model(init_std=0.1)
    prompts = [[tok.eot_id] + tok.encode(t) for t in ("To be, or not to be", "Hello", "My lord, I will")]
    cpu = Generator(model, tok).generate_ids(prompts, max_new_tokens=16, temperature=0, stop_ids=())
    gpu = Generator(tiny_model(init_std=0.1).cuda(), tok, compile=compile)
    assert gpu.generate_ids(prompts, max_new_tokens=16, temperature=0, stop_ids=()) == cpu
