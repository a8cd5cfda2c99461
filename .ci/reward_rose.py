#!/usr/bin/env python3
"""Did a training run learn? CI's check on the README's first command (`make train`).

A run that evaluated held-out tasks before and after training (`eval/comparison.json`, written by
the default recipe, experiment=first_run) is judged by that: it prints pass@1 before and after and
the paired gain with its 95% interval, in points, and exits 1 unless the interval's lower bound is
above 0. Any other run (experiment=tiny, ...) is judged by its reward: it reads csv/metrics.csv (one
row with `rollout/reward_mean` per step), prints the reward of every step, and exits 1 unless the
mean of the last steps beats the mean of the first steps by `--margin`; the window is a quarter of
the run (at least 1 step, at most 5).

    python3 .ci/reward_rose.py                      # the newest run under outputs/
    python3 .ci/reward_rose.py outputs/2026-12-03/05-41-00 --margin 0.1

Standard library only: it runs before or without the project's environment.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

KEY = "rollout/reward_mean"


def newest_run(root: Path) -> Path:
    """The run folder under `root` whose metrics were written last."""
    found = sorted(root.glob("**/csv/metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit(f"reward_rose: no csv/metrics.csv under {root}/")
    return found[-1].parent.parent


def rewards_by_step(run: Path) -> list[float]:
    path = run / "csv" / "metrics.csv"
    if not path.exists():
        sys.exit(f"reward_rose: FAIL: {path} does not exist (did the run log with logger=csv or default?)")
    with open(path, newline="") as f:
        return [float(row[KEY]) for row in csv.DictReader(f) if row.get(KEY)]


def held_out_gain(run: Path) -> bool | None:
    """Whether the held-out pass@1 rose (the paired gain's 95% interval above 0), printed; None
    when the run evaluated no held-out tasks."""
    path = run / "eval" / "comparison.json"
    if not path.exists():
        return None
    comparison = json.loads(path.read_text())
    before, after = (points(comparison[k]["pass_at_k"]["1"]) for k in ("a", "b"))
    gain = comparison["pass@1_diff"]
    rose = gain["low"] > 0
    print(f"reward_rose: {run}: held-out pass@1 before {before}, after {after} (%, 95% CI)")
    print(f"reward_rose: {'ok' if rose else 'FAIL'}: paired gain {points(gain, '+')} points (95% CI) over "
          f"{gain['tasks']} tasks (needed: its lower bound above 0)")  # fmt: skip
    return rose


def points(estimate: dict, sign: str = "") -> str:
    """`mean [low, high]` of an estimate in fractions, in points."""
    mean, low, high = (100 * estimate[k] for k in ("mean", "low", "high"))
    return f"{mean:{sign}.1f} [{low:{sign}.1f}, {high:{sign}.1f}]"


def reward_rose(run: Path, margin: float) -> bool:
    """Whether the mean reward of the last steps beat that of the first by `margin`, printed."""
    rewards = rewards_by_step(run)
    print(f"reward_rose: {run}: {KEY} by step: {' '.join(f'{r:.3f}' for r in rewards)}")
    if len(rewards) < 2:
        print(f"reward_rose: FAIL: {len(rewards)} step(s) logged, need at least 2")
        return False
    k = max(1, min(5, len(rewards) // 4))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    rose = last - first > margin
    verdict = "ok" if rose else "FAIL"
    print(f"reward_rose: {verdict}: mean of the last {k} steps {last:.3f} vs the first {k} {first:.3f} "
          f"({last - first:+.3f}, needed > {margin:+.3f})")  # fmt: skip
    return rose


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", nargs="?", type=Path, help="run folder (default: the newest under outputs/)")
    ap.add_argument("--margin", type=float, default=0.1, help="how far the last steps must beat the first")
    args = ap.parse_args()
    run = args.run or newest_run(Path("outputs"))
    rose = held_out_gain(run)
    if rose is None:
        rose = reward_rose(run, args.margin)
    return 0 if rose else 1


if __name__ == "__main__":
    sys.exit(main())
