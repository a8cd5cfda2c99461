""".ci/reward_rose.py, CI's check on `make train`: the held-out evaluation's paired gain judges a run
that has one (the default recipe, experiment=first_run), the reward curve any other run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fixture_paths import REPO


def write_run(run, rewards: list[float], gain: tuple[float, float, float] | None) -> None:
    """A run folder as train.py leaves it: csv/metrics.csv, and eval/comparison.json when the run
    evaluated held-out tasks (pass@1 as fractions)."""
    (run / "csv").mkdir(parents=True)
    rows = ["step,rollout/reward_mean", *(f"{i},{r}" for i, r in enumerate(rewards))]
    (run / "csv" / "metrics.csv").write_text("\n".join(rows) + "\n")
    if gain is not None:
        mean, low, high = gain
        pass1 = {"before": 0.30, "after": 0.30 + mean}
        comparison = {
            k: {"pass_at_k": {"1": {"mean": p, "low": p - 0.05, "high": p + 0.05, "tasks": 198}}}
            for k, p in zip(("a", "b"), pass1.values(), strict=True)
        }
        comparison["pass@1_diff"] = {"mean": mean, "low": low, "high": high, "tasks": 198}
        (run / "eval").mkdir()
        (run / "eval" / "comparison.json").write_text(json.dumps(comparison))


def reward_rose(run) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / ".ci" / "reward_rose.py"), str(run)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("gain", "rc", "verdict"),
    [((0.08, 0.03, 0.13), 0, "ok: paired gain +8.0 [+3.0, +13.0] points"),
     ((0.04, -0.01, 0.09), 1, "FAIL: paired gain +4.0 [-1.0, +9.0] points")],
)  # fmt: skip
def test_a_held_out_evaluation_decides_by_its_paired_gain(tmp_path, gain, rc, verdict):
    """The first run's reward is that of 20 noisy steps on groups DAPO picked for their spread: it
    can rise with no gain on held-out tasks, or the reverse. With eval/comparison.json the check
    reads the paired gain and passes only if its interval lies above 0, whatever the reward did
    (here it rose by 0.5 both times)."""
    write_run(tmp_path, [0.2, 0.2, 0.7, 0.7], gain)
    proc = reward_rose(tmp_path)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert "held-out pass@1 before 30.0 [25.0, 35.0]" in proc.stdout, proc.stdout
    assert verdict in proc.stdout, proc.stdout


@pytest.mark.parametrize(("rewards", "rc"), [([0.1, 0.1, 0.5, 0.6], 0), ([0.5, 0.5, 0.5, 0.5], 1)])
def test_a_run_without_one_decides_by_its_reward(tmp_path, rewards, rc):
    write_run(tmp_path, rewards, None)
    proc = reward_rose(tmp_path)
    assert proc.returncode == rc and "mean of the last 1 steps" in proc.stdout, proc.stdout + proc.stderr
