"""The GPU check's FSDP2 + DCP part (benchmarks/gpu/fsdp.py) in its --quick mode: two runs of `groundup train`
under torchrun with one process on the CPU (gloo), an asynchronous sharded save and a bit-exact resume."""

from __future__ import annotations

from gpu_check_helpers import quick_part


def test_quick_fsdp_part_resumes_bit_exact_and_reports_the_blocked_time(tmp_path):
    record, _ = quick_part("fsdp", tmp_path)
    r = record["results"]
    # FSDP2 on a one-process mesh (not the plain single-process path), saving asynchronously.
    assert (r["strategy"], r["world_size"], r["processes"], r["checkpoint_async"]) == ("fsdp", 1, 1, True)
    assert (r["steps"], r["save_at"], r["steps_compared"]) == (6, 3, 3)
    assert r["bit_exact"] is True and r["losses_equal"] and r["weights_equal"] and r["optimizer_equal"]
    assert r["weights_max_abs_diff"] == 0.0 and r["optimizer_max_abs_diff"] == 0.0 and r["loss_max_abs_diff"] == 0.0
    for key in ("async_save_blocked_s", "async_final_save_blocked_s", "sync_save_s"):
        assert isinstance(r[key], float) and r[key] >= 0, key
    assert [s["step"] for s in r["checkpoint_saves"]["async"]] == [3, 6]
    assert [s["step"] for s in r["checkpoint_saves"]["resumed_sync"]] == [6]
    assert r["blocked_share_of_sync"] == round(r["async_save_blocked_s"] / r["sync_save_s"], 4)
    assert r["step_s_median"] > 0 and r["tokens_per_s"] > 0 and r["tokens_per_step"] == r["batch"] * r["seq_len"]
    goals = {g["goal"]: g for g in record["goals"]}
    exact = goals["resume after an async sharded save continues bit-exact"]
    assert exact["value"] is True and exact["met"] is True
    share = goals["async save blocks the loop / synchronous save time"]
    assert share["value"] == r["blocked_share_of_sync"] and share["met"] == (share["value"] <= share["target"])
