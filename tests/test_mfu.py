"""Honest MFU: the FLOPs a step does (LoRA, frozen layers, recomputation) against their closed form and
against torch's own count of the matmuls; the peak from the GPU table or a quiet calibration cached per
machine; never above 100%, and the summary says where the peak came from."""

from __future__ import annotations

import datetime
import json
import re

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from conftest import tiny_config
from groundup.config import load_config
from groundup.errors import ConfigError
from groundup.model import Transformer
from groundup.model.lora import LoraConfig, apply_lora
from groundup.model.sizing import flops_per_token
from groundup.plan.gpus import get_gpu
from groundup.posttrain.config import SFTConfig
from groundup.posttrain.sft import sft
from groundup.quant import quantize_model
from groundup.train import peak as peak_module
from groundup.train.commands import print_summary
from groundup.train.flops import StepFlops, step_flops
from groundup.train.metrics import Utilization
from groundup.train.parallelize import split_fused
from groundup.train.peak import cpu_model, peak_flops, read_cache
from infer_helpers import VOCAB, model_dir, small_tokenizer, tiny_model
from train_helpers import metrics

T, R = 32, 4  # sequence length and LoRA rank of the closed forms
QKV, O, UP, DOWN = 64 * 128, 64 * 64, 64 * 384, 192 * 64  # the tiny preset's projections (GQA 4/2 heads, SwiGLU)
BLOCK = QKV + O + UP + DOWN
# LoRA per block: A (parts x rank x in) and B (out x rank) of qkv (3 parts), o, gate_up (2 parts), down
ADAPTERS = R * ((3 * 64 + 128) + (64 + 64) + (2 * 64 + 384) + (192 + 64))


def closed_form(mode: str, vocab: int = 256, seq: int = T) -> tuple[float, float]:
    """(model FLOPs, recomputed FLOPs) per token of one training step of the 2-layer tiny model."""
    out = 64 * vocab  # the tied output layer
    attn = 2 * 4 * (16 + 16) * seq  # one layer's score and value products, forward
    if mode in ("full", "recompute"):
        model = 6 * (2 * BLOCK + out) + 3 * 2 * attn
        # each block's forward again, but its down projection: torch stops the rerun at the last saved input
        return model, (2 * (2 * (BLOCK - DOWN) + attn) if mode == "recompute" else 0)
    if mode in ("lora", "lora_recompute"):
        forward = 2 * (2 * BLOCK + out + 2 * ADAPTERS) + 2 * attn
        # input gradients everywhere but block 0's first projection (its base and its A read the frozen embedding)
        input_grads = 2 * (2 * BLOCK + out + 2 * ADAPTERS - QKV - 3 * R * 64)
        weight_grads = 2 * 2 * ADAPTERS  # the adapters' alone
        recompute = 2 * (2 * (BLOCK + ADAPTERS - R * 64) + attn) if mode == "lora_recompute" else 0
        return forward + input_grads + weight_grads + 2 * 2 * attn, recompute
    assert mode == "frozen"  # the embedding (also the output layer) and block 0 frozen
    return (2 * BLOCK + attn) + (6 * BLOCK + 3 * attn) + 4 * out, 0


def _model(mode: str) -> Transformer:
    model = Transformer(tiny_config(max_seq_len=T))
    if mode.startswith("lora"):
        apply_lora(model, LoraConfig(rank=R, targets=["attention", "mlp"]))
    if mode == "frozen":
        for p in [*model.embed.parameters(), *model.blocks[0].parameters()]:
            p.requires_grad_(False)
    model.grad_checkpointing = mode.endswith("recompute")
    return model.train()


def _torch_count(model: Transformer) -> float:
    """torch's count of the matmuls one forward and backward run, per token (SDPA's math path: its
    products are matmuls torch counts)."""
    tokens = torch.randint(0, 256, (2, T))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens, tokens).loss.backward()
    return counter.get_total_flops() / tokens.numel()


@pytest.mark.parametrize("mode", ["full", "lora", "frozen", "recompute", "lora_recompute"])
def test_flops_per_step_match_the_closed_form_and_torchs_count(mode):
    model = _model(mode)
    f = step_flops(model, T, checkpointing=model.grad_checkpointing)
    want_model, want_recompute = closed_form(mode)
    assert (f.model, f.recompute) == (want_model, want_recompute)
    assert f.hardware == f.model + f.recompute  # HFU above MFU by the recomputed forward alone
    assert _torch_count(model) == f.hardware
    if mode == "full":  # 6N + attention: the planner's count, but for the norms' weights it calls matmuls
        norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
        assert f.model == flops_per_token(model.cfg, T) - 6 * norms
    if mode == "lora":
        assert f.model < 0.75 * closed_form("full")[0]  # no weight gradients for the frozen base
    if mode == "recompute":  # without torch's early stop each block's whole forward runs again
        with set_checkpoint_early_stop(False):
            assert step_flops(model, T, True).recompute == want_recompute + 2 * 2 * DOWN
            assert _torch_count(model) == f.model + want_recompute + 2 * 2 * DOWN


def test_qlora_does_the_matmuls_of_lora():
    model = Transformer(tiny_config(max_seq_len=T))
    quantize_model(model, "int8")  # integer base weights: frozen, no weight gradients either
    apply_lora(model, LoraConfig(rank=R, targets=["attention", "mlp"]))
    assert step_flops(model, T).model == closed_form("lora")[0]


def test_projections_split_for_tensor_parallelism_count_the_same():
    model = _model("full")
    split_fused(model)
    assert step_flops(model, T).model == closed_form("full")[0]


@pytest.mark.parametrize("name, key, bf16, fp32", [
    ("NVIDIA H100 80GB HBM3", "h100", 989.4e12, 66.9e12),
    ("NVIDIA H100 PCIe", "h100-pcie", 756e12, 51.2e12),
    ("NVIDIA H200", "h200", 989.4e12, 66.9e12),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb", 312e12, 19.5e12),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb", 312e12, 19.5e12),
])
def test_a_known_gpus_peak_comes_from_the_table(monkeypatch, tmp_path, name, key, bf16, fp32):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    gpu = get_gpu(key)  # the planner's table is the same table
    got = peak_flops(torch.device("cuda"), torch.bfloat16)
    assert (got.flops, got.source, got.reliable) == (pytest.approx(bf16), f"table: {gpu.label} bf16", True)
    # fp32 matmuls run at the plain FP32 rate: groundup does not turn TF32 on (the old table said TF32)
    assert not torch.backends.cuda.matmul.allow_tf32
    assert peak_flops(torch.device("cuda"), torch.float32).flops == pytest.approx(fp32) == gpu.fp32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        assert peak_flops(torch.device("cuda"), torch.float32).source == f"table: {gpu.label} tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    assert not (tmp_path / "groundup").exists()  # nothing measured, nothing cached


def test_a_gpu_the_table_lacks_is_calibrated_not_guessed(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 NVL")
    monkeypatch.setattr(peak_module, "_gpu_trial", lambda dtype, device: (700e12, 1.0))
    got = peak_flops(torch.device("cuda"), torch.bfloat16)
    assert got.flops == 700e12 and got.source.startswith("calibrated ") and got.source.endswith("NVIDIA H100 NVL")


class Trials:
    """A stand-in for the CPU matmul trial: (FLOP/s, share of the cores the threads got), counted."""

    def __init__(self, rate: float, share: float):
        self.rate, self.share, self.calls = rate, share, 0

    def __call__(self, dtype, threads):
        self.calls += 1
        return self.rate, self.share


def test_a_quiet_calibration_is_cached_per_machine_and_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    trials = Trials(50e9, 0.97)
    monkeypatch.setattr(peak_module, "_cpu_trial", trials)
    threads = torch.get_num_threads()
    first = peak_flops(torch.device("cpu"), torch.float32)
    today = datetime.date.today().isoformat()
    assert first.flops == 50e9 and first.reliable
    assert first.source == f"calibrated {today} on {cpu_model()}, {threads} thread{'s' if threads != 1 else ''}"
    measured = trials.calls
    assert measured > 1  # a warm-up, then several trials: the best counts
    (key, entry), = read_cache().items()
    assert (tmp_path / "groundup" / "peak_flops.json").is_file()
    assert cpu_model() in key and f"{threads} threads" in key and torch.__version__ in key and key.endswith("float32")
    assert entry["flops"] == 50e9 and entry["date"] == today

    again = peak_flops(torch.device("cpu"), torch.float32)  # e.g. the next run, on a busy machine
    assert trials.calls == measured and again == first  # reused: not measured again
    peak_flops(torch.device("cpu"), torch.bfloat16)  # another dtype is another calibration
    assert trials.calls == 2 * measured and len(read_cache()) == 2


def test_a_calibration_under_load_is_flagged_and_not_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    trials = Trials(10e9, 0.25)  # the threads got a quarter of their cores: 3 other programs ran on them
    monkeypatch.setattr(peak_module, "_cpu_trial", trials)
    got = peak_flops(torch.device("cpu"), torch.float32)
    assert got.flops == pytest.approx(40e9) and not got.reliable  # the rate per CPU-second, not the loaded rate
    assert "under load: its threads got 25% of their cores, so not cached" in got.source
    assert read_cache() == {}
    calls = trials.calls
    peak_flops(torch.device("cpu"), torch.float32)
    assert trials.calls == 2 * calls  # measured again: a quiet moment may come


def test_the_real_cpu_trial_measures_the_share_of_the_cores_it_got():
    rate, share = peak_module._cpu_trial(torch.float32, torch.get_num_threads(), seconds=0.05)
    assert rate > 1e8 and 0 < share < 1.5


@pytest.mark.parametrize("value", ["-1", "-1e12"])  # nan and inf: refused as no finite number
def test_a_peak_that_is_no_rate_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"log\.peak_flops = .*: expected 0 \(the GPU table or a calibration\)"):
        load_config(SFTConfig, None, ["base=x", f"log.peak_flops={value}"])


def test_a_rate_above_the_peak_disproves_it_and_the_cached_calibration_is_forgotten(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(peak_module, "_cpu_trial", Trials(1e9, 1.0))
    peak = peak_flops(torch.device("cpu"), torch.float32)
    notes = []
    util = Utilization(StepFlops(forward=2e6, backward=4e6, recompute=2e6), peak, processes=1, note=notes.append)
    assert util.of(100.0) == {"mfu": pytest.approx(0.6), "hfu": pytest.approx(0.8)}
    assert util.of(200.0) == {"mfu": None, "hfu": None}  # 160% HFU: impossible, so the peak is wrong
    assert util.of(100.0) == {"mfu": None, "hfu": None}  # and stays distrusted for the run
    assert len(notes) == 1 and "MFU not reported" in notes[0]
    assert read_cache() == {}  # the next run calibrates again
    summary = util.summary(100.0)
    assert summary["peak_flops_reliable"] is False and "unreliable: 200 tokens/s" in summary["peak_flops_source"]


# ---------------------------------------------------------------- a LoRA SFT run end to end

CHATS = [{"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                       {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]}
         for a in range(12) for b in range(4)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("mfu")
    model_dir(root / "base", tiny_model(max_seq_len=128), small_tokenizer())
    (root / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    return root


def _sft(root, run, *extra):
    cfg = load_config(SFTConfig, None, [f"base={json.dumps(str(root / 'base'))}",
                                        f"sft.data={json.dumps([str(root / 'chat.jsonl')])}", "lora.rank=4",
                                        "train.seq_len=128", "train.batch_size=2", "train.max_steps=3",
                                        "train.threads=2", "log.every=1", "log.progress=false", "eval.at_end=false",
                                        "sft.eval_generations=0", "checkpoint.every=100", *extra])
    summary = sft(cfg, run)
    steps, _ = metrics(run)
    return summary, steps


def test_lora_sft_reports_the_flops_it_does_and_where_its_peak_came_from(base, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    summary, steps = _sft(base, tmp_path / "run")
    assert summary["flops_per_token"] == closed_form("lora", VOCAB, 128)[0]  # not 6N: no base weight gradients
    assert "hfu" not in summary  # nothing is recomputed
    assert re.fullmatch(rf"(calibrated|estimated) \d{{4}}-\d\d-\d\d on {re.escape(cpu_model())}, 2 threads.*",
                        summary["peak_flops_source"])
    assert 0 < summary["mfu"] <= 1 and all(0 < s["mfu"] <= 1 for s in steps)
    print_summary(summary, "sft")
    line = capsys.readouterr().out
    assert f"MFU {summary['mfu']:.1%} of " in line and summary["peak_flops_source"] in line


@pytest.mark.parametrize("too_low", ["log.peak_flops", "cached calibration"])
def test_lora_sft_never_reports_mfu_above_100_percent(base, tmp_path, monkeypatch, capsys, too_low):
    """A peak measured on a loaded machine is far below what the cores do when the run trains: the run
    printed "MFU 159.5%". Now it says the peak is unreliable instead, and forgets a cached one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    extra = []
    if too_low == "log.peak_flops":
        extra = ["log.peak_flops=1e6"]
    else:
        threads = torch.get_num_threads()
        with monkeypatch.context() as m:
            m.setattr(peak_module, "_cpu_trial", Trials(1e6, 1.0))
            torch.set_num_threads(2)  # the run's train.threads
            peak_flops(torch.device("cpu"), torch.float32)  # what a measurement on a loaded machine left cached
            torch.set_num_threads(threads)
        assert len(read_cache()) == 1
    summary, steps = _sft(base, tmp_path / "run", *extra)
    assert summary["mfu"] is None and summary["peak_flops_reliable"] is False
    assert all(s["mfu"] is None or s["mfu"] <= 1 for s in steps)
    assert "unreliable" in summary["peak_flops_source"]
    print_summary(summary, "sft")
    out = capsys.readouterr().out
    assert "MFU not reported: peak 1.0 MFLOP/s (" in out and "unreliable" in out
    assert not re.search(r"MFU \d+\.\d%", out)
    if too_low != "log.peak_flops":
        assert read_cache() == {}  # forgotten: the next run calibrates again


def test_lora_sft_with_recomputed_activations_reports_hfu_beside_mfu(base, tmp_path, capsys):
    summary, steps = _sft(base, tmp_path / "run", "train.grad_checkpointing=true", "log.peak_flops=1e14")
    model, recompute = closed_form("lora_recompute", VOCAB, 128)
    assert (summary["flops_per_token"], summary["flops_per_token_hardware"]) == (model, model + recompute)
    assert summary["hfu"] == pytest.approx(summary["mfu"] * (model + recompute) / model)
    assert all(s["hfu"] > s["mfu"] for s in steps)
    print_summary(summary, "sft")
    assert f"MFU {summary['mfu']:.1%} (HFU {summary['hfu']:.1%} with the recomputed forward) of " \
           "100.0 TFLOP/s (log.peak_flops)" in capsys.readouterr().out
