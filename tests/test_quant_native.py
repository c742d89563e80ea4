"""groundup's native CPU kernels (quant/native.py): what `auto` runs on the CPU, without torch.compile.

The kernels themselves are checked against dequantize-then-matmul with the other backends
(tests/test_quant.py::test_each_kernel_matches_dequantize_then_matmul). Here: the default CPU path
compiles nothing (no warm-up before the first token: decoding, prefill, QLoRA's backward pass), a
torch.compile'd decode step keeps calling them over the integers, and a build lock left by a killed
build does not hang the next process."""

from __future__ import annotations

import os
import time

import pytest
import torch

from groundup.infer import Generator
from groundup.model.lora import LoraConfig, apply_lora
from groundup.quant import QuantLinear, kernels, native
from infer_helpers import small_tokenizer
from test_quant import _quantized

needs_native = pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: "
                                                                 f"{native.why_unavailable()}")


@needs_native
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_the_default_cpu_path_compiles_nothing(method):
    assert kernels.get_kernel_backend() == "auto" and kernels.backend_for(torch.device("cpu")) == "native"
    kernels._compiled.clear()
    model = _quantized("gqa", method)
    tok = small_tokenizer()
    long = tok.encode("To be, or not to be, that is the question: whether 'tis nobler in the mind " * 3)[:60]
    assert len(long) > kernels.NATIVE_ROWS  # prefill through the float weight, decoding through int8_mm/int4_mm
    with torch.inference_mode():
        reference = [int(model(torch.tensor([long])).logits[0, -1].argmax())]
    assert Generator(model, tok).generate_ids([long], max_new_tokens=1, temperature=0, stop_ids=())[0] == reference
    model.train()
    apply_lora(model, LoraConfig(rank=4, alpha=8))
    tokens = torch.tensor([long])
    model(tokens, tokens).loss.backward()  # QLoRA: the backward pass dequantizes each weight again
    assert not kernels._compiled  # nothing went through torch.compile


@needs_native
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_a_compiled_decode_step_keeps_the_integer_weights_and_the_tokens(method):
    """Generator(compile=True) freezes weights into the graph; the quantized matmuls must stay kernels over
    the integers there (inductor would fold a dequantize into a float copy of every weight)."""
    from torch._inductor.codecache import PyCodeCache

    def constants():
        modules = PyCodeCache.modules if isinstance(PyCodeCache.modules, list) else list(PyCodeCache.modules.values())
        return {id(v): v for m in modules for v in vars(m).values() if isinstance(v, torch.Tensor)}

    model = _quantized("gqa", method)
    tok = small_tokenizer()
    prompts = [tok.encode("To be, or not"), tok.encode("Now is the winter")]
    eager = Generator(model, tok).generate_ids(prompts, max_new_tokens=8, temperature=0, stop_ids=())
    before = constants()
    compiled = Generator(model, tok, compile=True).generate_ids(prompts, max_new_tokens=8, temperature=0, stop_ids=())
    assert compiled == eager
    new = [v for k, v in constants().items() if k not in before]
    shapes = {tuple(m.qweight.shape[:-1]) + (m.in_features,) for m in model.modules() if isinstance(m, QuantLinear)}
    floats = {tuple(v.shape) for v in new if v.is_floating_point() and v.dim() == 2}
    assert not floats & (shapes | {s[::-1] for s in shapes})  # no float copy of a quantized weight
    assert any(v.dtype in (torch.int8, torch.uint8) for v in new)  # the integers themselves are in the graph


def test_a_stale_build_lock_is_removed_and_a_live_one_waited_for_then_given_up(tmp_path, monkeypatch):
    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - native.STALE_LOCK_S - 5
    os.utime(lock, (old, old))  # left by a build killed long ago: cpp_extension would wait for it forever
    assert native._wait_for_lock(lock) and not lock.exists()
    lock.touch()  # another process building now
    monkeypatch.setattr(native, "LOCK_WAIT_S", 0.3)
    t = time.monotonic()
    assert not native._wait_for_lock(lock) and lock.exists() and time.monotonic() - t >= 0.3
    assert native._wait_for_lock(tmp_path / "no-lock")
