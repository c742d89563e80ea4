"""The GPU check's server part (benchmarks/gpu/serve.py) in its --quick mode: a real `groundup serve` on the CPU."""

from __future__ import annotations

import importlib.util

import pytest

from gpu_check_helpers import quick_part


pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "httpx")),
    reason="benchmarks/gpu/serve.py --quick starts `groundup serve`, which needs fastapi, uvicorn and httpx")


def test_quick_serve_part_writes_its_result(tmp_path):
    record, _ = quick_part("serve", tmp_path, timeout=120)
    results = record["results"]
    assert set(results["levels"]) == {"1", "4", "8"}
    output_tokens = results["requests"]["output_tokens"]
    for concurrency, level in results["levels"].items():
        assert level["concurrency"] == int(concurrency)
        assert level["errors"] == 0 and level["incomplete"] == 0, level["error_examples"]
        assert level["completion_tokens"] == level["requests"] * output_tokens  # ignore_eos: exact counts
        assert level["tokens_per_s"] > 0
        assert 0 < level["ttft_p50_s"] <= level["ttft_p99_s"]
        assert level["decode_steps"] > 0
    assert results["errors"] == 0 and results["incomplete"] == 0
    assert results["server"]["max_batch"] >= 8
    ratio = results["speedup_c8_vs_c1"]
    assert ratio > 0
    goals = {g["goal"]: g for g in record["goals"]}
    speed = goals["server tokens/s at concurrency 64 vs 1"]
    assert speed["target"] == 10 and speed["value"] == ratio and speed["met"] == (ratio >= 10)
    clean = goals["errors + incomplete responses at every level"]
    assert clean["value"] == 0 and clean["met"] is True
