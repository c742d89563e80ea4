"""benchmarks/gpu/decode.py --quick: the GPU check's decode part runs on the CPU and writes a real result.

One subprocess (~30 s on a 2-core CPU): the tiny model against transformers `generate` at batch 1, 8
and 64, the quantized kernels and the int8 / int4 engine decode.
"""

from __future__ import annotations

import json

import pytest

from gpu_check_helpers import quick_part



@pytest.fixture(scope="module")
def record(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu-decode")
    record, stdout = quick_part("decode", out)
    assert json.loads(stdout.strip().splitlines()[-1]) == record  # the final write is printed, once
    assert not list(out.glob(".*.tmp"))
    return record


def test_the_record_names_the_part_and_no_measurement_failed(record):
    assert record["part"] == "decode" and record["quick"] is True and record["device"] == "cpu"
    assert not [n for n in record["notes"] if "failed" in n or "skipped" in n or "partial" in n], record["notes"]
    assert record["seconds"] > 0


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_every_side_decodes_at_every_batch_size_with_the_same_tokens(record, batch):
    out = record["results"][f"batch_{batch}"]
    for side in ("groundup", "transformers", "transformers_static"):
        assert out[side]["tokens_per_s"] > 0, side
        assert out[side]["median_s"] > 0 and len(out[side]["runs_s"]) == record["results"]["repeat"]
    # float32 on both sides: greedy paths agree (a share is reported on the GPU, where bf16 may part them)
    assert out["groundup"]["identical_rows_vs_transformers"] == 1.0
    assert out["transformers_static"]["identical_rows_vs_transformers"] == 1.0
    assert out["groundup"]["mean_tokens_before_difference"] == record["results"]["new_tokens"]
    assert out["transformers_static"]["compiled"] is False  # transformers compiles on CUDA only
    assert out["ours_best_vs_transformers_best"] > 0


def test_the_goal_is_the_batch_1_ratio_against_transformers_best(record):
    (g,) = record["goals"]
    assert g["goal"] == "decode batch 1 vs HF generate" and g["target"] == 1.5
    assert g["value"] == record["results"]["batch_1"]["ours_best_vs_transformers_best"]
    assert g["met"] == (g["value"] >= 1.5)


def test_quantized_kernels_and_decoding_are_reported(record):
    kernels = record["results"]["kernels"]
    assert kernels["backend"] == "dequant"
    rows = [v for k, v in kernels.items() if isinstance(v, dict)]
    assert rows
    for r in rows:
        for fmt in ("int8", "int4"):
            assert r[fmt]["us"] > 0 and r[fmt]["max_rel_err_vs_dequantized"] < 1e-4
    for batch in (1, 8, 64):
        out = record["results"]["quantized_decode"][f"batch_{batch}"]
        for fmt in ("int8", "int4"):
            assert out[fmt]["tokens_per_s"] > 0 and out[fmt]["speed_vs_float32"] > 0
            assert 0 <= out[fmt]["identical_rows_vs_float32"] <= 1
