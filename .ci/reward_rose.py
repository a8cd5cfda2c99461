#!/usr/bin/env python3
"""Did a training run's reward rise? CI's check on the README's first command (`make train`).

Reads the run's csv/metrics.csv (one row with `rollout/reward_mean` per step), prints the reward of
every step, and exits 1 unless the mean of the last steps beats the mean of the first steps by
`--margin`. The window is a quarter of the run (at least 1 step, at most 5), so the check holds
whatever `make train` trains by default: the tiny model's 30 steps or a real model's run.

    python3 .ci/reward_rose.py                      # the newest run under outputs/
    python3 .ci/reward_rose.py outputs/2026-12-03/05-41-00 --margin 0.1

Standard library only: it runs before or without the project's environment.
"""

from __future__ import annotations

import argparse
import csv
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", nargs="?", type=Path, help="run folder (default: the newest under outputs/)")
    ap.add_argument("--margin", type=float, default=0.1, help="how far the last steps must beat the first")
    args = ap.parse_args()
    run = args.run or newest_run(Path("outputs"))
    rewards = rewards_by_step(run)
    print(f"reward_rose: {run}: {KEY} by step: {' '.join(f'{r:.3f}' for r in rewards)}")
    if len(rewards) < 2:
        print(f"reward_rose: FAIL: {len(rewards)} step(s) logged, need at least 2")
        return 1
    k = max(1, min(5, len(rewards) // 4))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    rose = last - first > args.margin
    verdict = "ok" if rose else "FAIL"
    print(f"reward_rose: {verdict}: mean of the last {k} steps {last:.3f} vs the first {k} {first:.3f} "
          f"({last - first:+.3f}, needed > {args.margin:+.3f})")  # fmt: skip
    return 0 if rose else 1


if __name__ == "__main__":
    sys.exit(main())
