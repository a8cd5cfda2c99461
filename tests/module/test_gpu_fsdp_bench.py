"""bench/gpu_fsdp.py, the device script of sharded training, dry-run on the CPU (`--device cpu`, 2
gloo ranks, the tiny model): its steps train, push, and report a fresh logprob gap, so the script a
GPU session runs is known to work before device time is spent on it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fixture_paths import REPO


@pytest.mark.slow
def test_gpu_fsdp_bench_dry_runs_on_the_cpu(tiny_model_dir, tmp_path):
    out = tmp_path / "summary.json"
    cmd = [sys.executable, "bench/gpu_fsdp.py", "--device", "cpu", "--model", str(tiny_model_dir),
           "--devices", "2", "--steps", "2", "--groups", "2", "--group-size", "4", "--prompt-len", "16",
           "--max-tokens", "8", "--token-budget", "64", "--work", str(tmp_path), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(out.read_text())
    print(proc.stdout.splitlines()[-1])
    assert summary["world"] == 2 and summary["steps"] == 2
    assert summary["versions"] == [1.0, 2.0]  # every step pushed
    assert summary["push_mb"] > 0 and summary["tokens"] == 2 * 4 * (16 + 8)
    # the rows of step 2 were sampled after step 1's push: fp32 on both sides, the gap is rounding
    assert all(gap < 1e-4 for gap in summary["gaps"])
    assert summary["mfu"] is None  # no GPU peak on a CPU
