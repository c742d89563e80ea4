"""Weight-only quantization: formats, kernels, GPTQ, quantized models through the engine, the verb."""

from __future__ import annotations

import contextlib
import itertools
import json
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import MLA
from groundup.cli import main
from groundup.config import ConfigError
from groundup.errors import CheckpointError, DataError
from groundup.infer import Generator
from groundup.model.moe import MoE
from groundup.quant import (QuantLinear, QuantMoE, QuantizedTransformer, QuantWeight, is_quantized,
                            load_quantized_model, quantize_model, save_quantized_model, set_kernel_backend)
from groundup.quant import kernels
from groundup.quant.formats import (dequantize_int4, dequantize_int8, pack_int4, quantize_int4, quantize_int8,
                                    unpack_int4)
from groundup.quant.gptq import Hessian, gptq, relative_error
from groundup.quant.modules import float_moe_forward
from infer_helpers import model_dir, small_tokenizer, tiny_model

MOE = {"n_experts": 4, "moe_top_k": 2, "n_shared_experts": 1, "n_dense_layers": 1}
VARIANTS = {"gqa": {}, "moe": MOE, "mla": MLA, "mla_moe_untied": {**MLA, **MOE, "tie_embeddings": False}}


@contextlib.contextmanager
def backend(name: str):
    previous = set_kernel_backend(name)
    try:
        yield
    finally:
        set_kernel_backend(previous)


def _weights(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape[:-1], 1, generator=g))  # rows of varied scale
    w[..., 0, :] = 0.0  # an all-zero row
    return w


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


# ----------------------------------------------------------------------------- formats


def test_int8_round_trip_is_within_half_a_step_and_uses_the_full_range():
    w = _weights(3, 40, 72)
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and s.shape == (3, 40)
    assert int(q.min()) >= -127 and int(q.max()) <= 127
    assert torch.equal(q[:, 1:].abs().amax(-1), torch.full((3, 39), 127, dtype=torch.int8))  # each row's max hits 127
    err = (dequantize_int8(q, s) - w).abs()
    assert bool((err <= s.unsqueeze(-1) / 2 * (1 + 1e-5) + 1e-12).all())
    assert bool((q[:, 0] == 0).all()) and torch.equal(dequantize_int8(q, s)[:, 0], w[:, 0])


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_round_trip_is_within_half_a_step_in_every_group(group_size):
    w = _weights(2, 24, 256) + 0.3  # shifted: groups not centred on zero
    w[:, 0] = 0.0
    qweight, s, z = quantize_int4(w, group_size)
    G = 256 // group_size
    assert qweight.dtype == torch.uint8 and qweight.shape == (2, 24, 128)
    assert s.shape == z.shape == (2, 24, G) and z.dtype == torch.uint8 and int(z.max()) <= 15
    q = unpack_int4(qweight, group_size)
    assert int(q.max()) <= 15 and int(q.max()) == 15 and int(q.min()) == 0
    err = (dequantize_int4(qweight, s, z, group_size) - w).abs().reshape(2, 24, G, group_size)
    assert bool((err <= s.unsqueeze(-1) / 2 * (1 + 1e-5) + 1e-7).all())
    assert torch.equal(dequantize_int4(qweight, s, z, group_size)[:, 0], torch.zeros(2, 256))  # zero is exact


def test_int4_packing_is_planar_per_group():
    q = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = pack_int4(q, 32)
    assert torch.equal(unpack_int4(packed, 32), q)
    # byte j of group i: column i*32 + j in the low nibble, column i*32 + 16 + j in the high one
    assert int(packed[2, 16 + 3]) == int(q[2, 32 + 3]) | (int(q[2, 32 + 16 + 3]) << 4)


# ----------------------------------------------------------------------------- kernels


def _linear_pair(fmt, N, K, bias=False, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    q = QuantLinear.from_linear(lin, fmt, 32 if fmt == "int4" else None)
    return lin, q


@pytest.mark.parametrize("name", ["native", "compiled", "packed", "dequant"])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_each_kernel_matches_dequantize_then_matmul(name, fmt):
    shapes = [(80, 64)] if name == "compiled" else [(80, 64), (48, 96)]  # 80 rows: not a multiple of 16
    if name == "native":  # its SIMD paths (M = 1, tiles, any rows) and the scalar tails (K = 40, 7 rows)
        from groundup.quant import native

        if not native.available():
            pytest.skip(f"native kernels unavailable: {native.why_unavailable()}")
        shapes += [(7, 40), (130, 256)] if fmt == "int8" else [(130, 256)]
    for N, K in shapes:
        _, q = _linear_pair(fmt, N, K, bias=True)
        w = (dequantize_int8(q.qweight, q.scales) if fmt == "int8"
             else dequantize_int4(q.qweight, q.scales, q.zeros, q.group_size))  # formats.py's, eager
        with backend(name):
            assert torch.equal(q.dequantize(torch.float32), w)  # every backend's dequantize, bit for bit
        # decoding rows (<= NATIVE_ROWS: the native integer kernels) and prefill rows (float weight + BLAS)
        for x in (torch.randn(1, K), torch.randn(3, K), torch.randn(8, K), torch.randn(2, 4, K), torch.randn(40, K)):
            with backend(name), torch.inference_mode():
                y = q(x)
            ref = F.linear(x, w, q.bias)
            assert y.shape == ref.shape and y.dtype == x.dtype
            assert _rel(y, ref) < 1e-4, (name, fmt, N, K, tuple(x.shape))


def test_cpu_int8_kernel_with_bf16_and_k_not_a_multiple_of_16_falls_back_with_a_warning():
    _, q = _linear_pair("int8", 32, 40)
    x = torch.randn(3, 40, dtype=torch.bfloat16)
    kernels._warned.clear()
    with backend("packed"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = q(x)
    assert any("no packed int8 kernel for weight (32, 40)" in str(c.message) for c in caught)
    assert _rel(y, F.linear(x.float(), q.dequantize(torch.float32))) < 2e-2


def test_experts_of_a_stacked_weight_use_the_same_kernels():
    w = torch.randn(3, 48, 64)
    qw = QuantWeight.from_float(w, "int4", 32)
    for e in range(3):
        x = torch.randn(2, 64)
        ref = F.linear(x, dequantize_int4(qw.qweight[e], qw.scales[e], qw.zeros[e], 32))
        with backend("compiled"), torch.inference_mode():
            assert _rel(qw.matmul(x, e), ref) < 1e-4


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_cuda_kernels_match_dequantize_then_matmul(fmt):
    _, q = _linear_pair(fmt, 80, 256)
    q = q.to("cuda")
    x = torch.randn(4, 256, device="cuda")
    with torch.inference_mode():
        y = q(x)
    # the CUDA int4 kernel computes in bfloat16
    assert _rel(y, F.linear(x, q.dequantize(torch.float32))) < (1e-4 if fmt == "int8" else 2e-2)


# ----------------------------------------------------------------------------- GPTQ


def _planted(N=48, K=256, n=2048, seed=0):
    """Inputs that lie near a 12-dimensional subspace, with columns of very different scales:
    rounding errors that cancel on it cost nothing, which GPTQ finds and RTN cannot."""
    g = torch.Generator().manual_seed(seed)
    X = (torch.randn(n, 12, generator=g) @ torch.randn(12, K, generator=g) + 0.05 * torch.randn(n, K, generator=g))
    X = X * torch.exp(torch.randn(K, generator=g))
    W = torch.randn(N, K, generator=g) * 0.05
    h = Hessian(K, "cpu")
    for chunk in X.split(500):
        h.add(chunk)
    return W, X, h


def test_hessian_accumulates_two_x_transpose_x_over_rows():
    W, X, h = _planted()
    assert h.n == len(X)
    assert torch.allclose(h.H, 2 * X.T @ X / len(X), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("fmt, group_size", [("int4", 32), ("int4", 128), ("int8", None)])
def test_gptq_beats_round_to_nearest_on_correlated_inputs_and_act_order_does_not_hurt(fmt, group_size):
    W, X, h = _planted()
    rtn = dequantize_int8(*quantize_int8(W)) if fmt == "int8" else \
        dequantize_int4(*quantize_int4(W, group_size), group_size)
    q, s, z, Q = gptq(W, h.H, fmt, group_size)
    _, _, _, Q_act = gptq(W, h.H, fmt, group_size, act_order=True)

    def output_error(Qw):  # measured on the inputs themselves
        return float((X @ (W - Qw).T).square().sum() / (X @ W.T).square().sum())

    assert relative_error(W, Q, h.H) == pytest.approx(output_error(Q), rel=1e-3)
    assert output_error(Q) < output_error(rtn) / 5
    assert output_error(Q_act) <= output_error(Q)
    # the integers are in range and dequantize to the weight GPTQ reports
    if fmt == "int8":
        assert q.abs().max() <= 127 and torch.allclose(q * s[:, None], Q)
    else:
        assert q.min() >= 0 and q.max() <= 15 and z.max() <= 15
        G = W.shape[1] // group_size
        deq = ((q.view(-1, G, group_size) - z[..., None]) * s[..., None]).view_as(Q)
        assert torch.allclose(deq, Q, atol=1e-6)


def test_gptq_model_reports_per_layer_errors_below_round_to_nearest():
    model = tiny_model(**MOE)
    model.blocks[1].mlp.expert_bias[3] = -10.0  # no token is routed to expert 3: it is rounded to nearest
    rows = torch.randint(0, 512, (6, 96), generator=torch.Generator().manual_seed(1))
    report = quantize_model(model, "gptq", group_size=32, calibration=rows, act_order=True)
    names = [r.name for r in report.layers]
    experts = next(r for r in report.layers if r.name == "blocks.1.mlp.experts_in")
    assert experts.how == "gptq (1 of 4 experts got no calibration token: rounded to nearest)"
    assert "blocks.1.mlp.experts_in" in names and "blocks.1.mlp.shared.down_proj" in names
    assert "blocks.1.mlp.router" not in names and isinstance(model.blocks[1].mlp, QuantMoE)
    errors = report.errors()
    assert set(errors) == set(names) and all(0 < e < 0.1 for e in errors.values())
    assert all(r.how.startswith("gptq") and r.tokens for r in report.layers)
    with torch.inference_mode():  # the quantized MoE runs, expert 3 included once its bias allows it
        model.blocks[1].mlp.expert_bias.zero_()
        assert model(rows[:2, :16]).logits.isfinite().all()
    gptq_mean = sum(r.output_error for r in report.layers) / len(report.layers)
    rtn_mean = sum(r.rtn_output_error for r in report.layers) / len(report.layers)
    assert gptq_mean < rtn_mean
    assert model.quant_spec.calibration_tokens == 6 * 96 and model.quant_spec.act_order


def test_gptq_quantizes_an_untied_output_layer_on_the_final_hidden_states():
    model = tiny_model(tie_embeddings=False)
    rows = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(3))
    report = quantize_model(model, "gptq", group_size=32, calibration=rows, include_embeddings=True)
    how = {r.name: r.how for r in report.layers}
    assert how["lm_head"] == "gptq" and how["embed"].startswith("rtn")
    head = next(r for r in report.layers if r.name == "lm_head")
    assert head.output_error < head.rtn_output_error and head.tokens == 4 * 64


# ----------------------------------------------------------------------------- quantized models


def test_the_moe_forward_over_callables_is_moe_forward():
    moe = tiny_model(**MOE).blocks[1].mlp
    assert isinstance(moe, MoE)
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        assert torch.allclose(float_moe_forward(moe, x)[0], moe(x)[0], atol=1e-6)


def _quantized(variant: str, method: str, **kw):
    model = tiny_model(**VARIANTS[variant])
    if method == "gptq":
        kw.setdefault("calibration", torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(2)))
    quantize_model(model, method, group_size=32 if method != "int8" else None, **kw)
    return model


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_saved_quantized_model_loads_with_identical_logits(tmp_path, variant):
    tokens = torch.randint(0, 512, (2, 12))
    for method, kw in (("int4", {}), ("int8", {"include_embeddings": True})):
        model = _quantized(variant, method, **kw)
        save_quantized_model(model, tmp_path / method)
        assert is_quantized(tmp_path / method) and not is_quantized(tmp_path)
        loaded = load_quantized_model(tmp_path / method)
        assert isinstance(loaded, QuantizedTransformer) and loaded.quant_spec.modules == model.quant_spec.modules
        with backend("dequant"), torch.inference_mode():
            assert torch.equal(loaded(tokens).logits, model(tokens).logits)


def test_quantized_logits_are_close_to_full_precision_and_int8_much_closer_than_int4():
    tokens = torch.randint(0, 512, (2, 16))
    with torch.inference_mode():
        for variant in VARIANTS:
            ref = tiny_model(**VARIANTS[variant])(tokens).logits
            with backend("dequant"):
                err = {m: float((_quantized(variant, m)(tokens).logits - ref).norm() / ref.norm())
                       for m in ("int8", "int4")}
            assert err["int8"] < 0.01 and err["int4"] < 0.1, (variant, err)
            assert err["int8"] < err["int4"] / 5, (variant, err)


def test_quantized_embeddings_and_output_layer_and_the_loss_path():
    for tied in (True, False):
        model = tiny_model(tie_embeddings=tied)
        tokens = torch.randint(0, 512, (2, 10))
        with torch.no_grad():
            ref = model(tokens[:, :-1], tokens[:, 1:])
        report = quantize_model(model, "int8", include_embeddings=True)
        names = {r.name for r in report.layers}
        assert "embed" in names and ("lm_head" in names) == (not tied)
        with torch.no_grad():
            out = model(tokens[:, :-1], tokens[:, 1:])  # the fused loss reads the dequantized output weight
            logits = model(tokens).logits  # the output layer through the kernel
        assert abs(float(out.loss) - float(ref.loss)) < 1e-2
        assert logits.shape == (2, 10, 512) and logits.dtype == torch.float32


def test_greedy_generation_through_the_engine_equals_argmax_of_full_forwards():
    tok = small_tokenizer()
    prompt = tok.encode("To be, or not")
    for variant, method, name in (("gqa", "int4", "auto"), ("mla_moe_untied", "int8", "dequant")):
        model = _quantized(variant, method)
        with backend(name):
            out = Generator(model, tok).generate_ids([prompt, prompt[:3]], max_new_tokens=10, temperature=0,
                                                     stop_ids=())
            for row, ids in zip(out, (prompt, prompt[:3])):
                ids = list(ids)
                with torch.inference_mode():
                    for _ in range(10):
                        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
                assert row == ids[-10:], variant
            assert isinstance(Generator(model, tok).generate("To be", max_new_tokens=5, temperature=0)[0], str)


def test_a_loaded_model_casts_to_bf16_and_keeps_integer_weights():
    model = _quantized("gqa", "int4")
    model.to(torch.bfloat16)
    layer = model.blocks[0].attn.qkv_proj
    assert layer.qweight.dtype == torch.uint8 and layer.scales.dtype == torch.bfloat16
    with backend("dequant"), torch.inference_mode():
        assert model(torch.randint(0, 512, (1, 8))).logits.isfinite().all()


# ----------------------------------------------------------------------------- bad input


def test_bad_requests_are_clear_errors():
    with pytest.raises(ConfigError, match=r"unknown quantization method \(did you mean 'gptq'\?\)"):
        quantize_model(tiny_model(), "gtpq")
    with pytest.raises(ConfigError, match=r"layer blocks\.0\.attn\.qkv_proj has shape 128x64: its input dimension "
                                          r"64 is not a multiple of the group size 128"):
        quantize_model(tiny_model(), "int4")
    with pytest.raises(ConfigError, match="GPTQ needs calibration"):
        quantize_model(tiny_model(), "gptq", group_size=32)
    model = _quantized("gqa", "int8")
    with pytest.raises(ConfigError, match=r"already quantized \(int8"):
        quantize_model(model, "int4", group_size=32)


@pytest.fixture(scope="module")
def cli_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    model_dir(root / "model", tiny_model())
    from groundup.corpus import iter_shakespeare

    texts = [w["text"][:20_000] for w in itertools.islice(iter_shakespeare(), 2)]
    (root / "cal.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (root / "short.jsonl").write_text(json.dumps({"text": "To be, or not to be"}) + "\n")
    return root


def _cli(capsys, *argv):
    code = main(["quantize", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_quantize_verb_writes_a_model_directory_the_engine_runs(cli_dirs, capsys):
    out_dir = cli_dirs / "q-gptq"
    code, out, err = _cli(capsys, "--checkpoint", cli_dirs / "model", "--method", "gptq", "--group-size", 32,
                          "--calibration", cli_dirs / "cal.jsonl", "--calibration-tokens", 1024, "--seq-len", 128,
                          "--act-order", "--out", out_dir)
    assert code == 0, err
    assert "wrote" in out and "round-to-nearest on the same inputs" in out
    assert (out_dir / "model.safetensors").is_file() and (out_dir / "tokenizer" / "tokenizer.json").is_file()
    spec = load_quantized_model(out_dir).quant_spec
    assert (spec.method, spec.bits, spec.group_size, spec.act_order, spec.calibration_tokens) == \
        ("gptq", 4, 32, True, 1024)
    model = load_quantized_model(out_dir)
    with backend("dequant"):
        assert Generator(model, small_tokenizer()).generate("To be", max_new_tokens=4, temperature=0)


def test_gptq_calibrates_on_the_embedded_corpus_by_default(cli_dirs, capsys):
    from groundup.quant.calibration import embedded_records

    first = [r["domain"] for r in itertools.islice(embedded_records(), 6)]
    assert first == ["text", "code", "math"] * 2  # every domain in the first tokens
    code, out, err = _cli(capsys, "--checkpoint", cli_dirs / "model", "--method", "gptq", "--group-size", 32,
                          "--calibration-tokens", 1024, "--seq-len", 128, "--out", cli_dirs / "q-default")
    assert code == 0, err
    assert load_quantized_model(cli_dirs / "q-default").quant_spec.calibration_tokens == 1024


def test_quantize_verb_refuses_bad_input_by_name(cli_dirs, capsys):
    model = cli_dirs / "model"
    assert _cli(capsys, "--checkpoint", model, "--method", "int8", "--out", cli_dirs / "q8")[0] == 0
    cases = [
        (["--method", "int5"], "unknown quantization method (did you mean 'int8'?"),
        (["--method", "int4"], "input dimension 64 is not a multiple of the group size 128"),
        (["--method", "gptq", "--group-size", 32, "--calibration", cli_dirs / "short.jsonl"],
         "calibration text too short: " + str(cli_dirs / "short.jsonl") + " gave"),
        (["--method", "int8", "--out", cli_dirs / "q8"], "exists and is not empty; pass --overwrite"),
        (["--method", "int8", "--out", model], "which this command reads"),
        (["--method", "int8", "--group-size", 32], "group sizes apply to 4-bit only"),
    ]
    for args, message in cases:
        code, _, err = _cli(capsys, "--checkpoint", model, *args)
        assert code == 2 and message in err, (args, err)
    code, _, err = _cli(capsys, "--checkpoint", cli_dirs / "q8", "--method", "int4", "--out", cli_dirs / "again")
    assert code == 2 and "is already quantized (int8" in err
    assert _cli(capsys, "--checkpoint", model, "--method", "int8", "--out", cli_dirs / "q8", "--overwrite")[0] == 0


def test_a_damaged_quantized_directory_is_refused_by_name(cli_dirs, tmp_path):
    import shutil

    shutil.copytree(cli_dirs / "q8", tmp_path / "q")
    toml = (tmp_path / "q" / "model.toml").read_text()
    (tmp_path / "q" / "model.toml").write_text(toml.replace('"blocks.0.attn.o_proj"', '"blocks.0.attn.x_proj"'))
    with pytest.raises(CheckpointError, match="x_proj"):
        load_quantized_model(tmp_path / "q")
    (tmp_path / "q" / "model.toml").write_text(toml.replace('method = "int8"', 'method = "int3"'))
    with pytest.raises(CheckpointError, match=r"\[quantization\] method = 'int3'"):
        load_quantized_model(tmp_path / "q")
    with pytest.raises(CheckpointError, match="not a quantized model"):
        load_quantized_model(cli_dirs / "model")
    with pytest.raises(DataError):
        from groundup.quant.calibration import calibration_rows

        calibration_rows([cli_dirs / "short.jsonl"], small_tokenizer())
