"""benchmarks/gpu_check.py in --quick mode (the CPU run that keeps the GPU check from rotting): the driver
runs the CUDA tests' collection and the pretraining part, and writes the JSON, the Markdown table and the log.
The other parts' quick runs have their own tests (tests/test_gpu_check_*.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_check import cuda_test_files, summary_counts  # noqa: E402


def test_the_summary_line_and_the_cuda_files_are_read():
    assert summary_counts("3 passed, 1 failed, 2 skipped, 1 error in 4.10s") == {
        "passed": 3, "failed": 1, "skipped": 2, "errors": 1}
    assert {"tests/test_cuda.py", "tests/test_quant.py"} <= set(cuda_test_files())


def test_quick_check_writes_every_parts_record_and_the_goals_table(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--quick", "--out",
                           str(tmp_path), "--parts", "tests,pretrain"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    tests, pretrain = report["parts"]
    assert tests["results"]["failed"] == tests["results"]["errors"] == 0 and tests["results"]["skipped"] >= 7
    variants = pretrain["results"]["quick"]["variants"]
    assert set(variants) == {"ours-adamw", "ours-muon", "hf-adamw"}, pretrain["notes"]
    for row in variants.values():
        assert row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1
    assert pretrain["results"]["quick"]["params"] == 131392  # 512 x 64 tied + 2 blocks of the tiny shape
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| tests | every CUDA test passes | 0 | 0 | yes |" in table and "## pretrain" in table
    assert "===== pretrain" in (tmp_path / "gpu_check.log").read_text()
