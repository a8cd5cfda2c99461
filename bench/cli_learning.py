"""Does a real CLI harness learn? `experiment=cli_sanity` with weight pushes against the same run
without them (`module/weight_sync=none`), side by side, on the CLI's case-task warm start.

Each run is `python train.py experiment=cli_sanity harness=<cli>` (the `case` task: capitals or
lowercase by prompt, one group of 8 of each a step): the harness CLI runs unmodified in its
sandbox against the gateway. Printed per harness: the mean reward by step for both runs, by case
for the push run, the push run's lead over the control's mean, the wall time of each run and how
many rollouts were masked as infrastructure failures or scored as harness errors. The control
runs `--control-steps` steps: its weights never move, so its steps only estimate one number.

tests/test_train.py runs this pair in CI for pi and for Claude Code on its lean request
(experiment=cli_sanity_claude_code); Claude Code's full ~15k-token rows make one of its runs
~25+ minutes on 2 CPU cores, so that one is measured here only.

    python bench/cli_learning.py --harness pi
    python bench/cli_learning.py --harness claude_code --experiment cli_sanity_claude_code
    python bench/cli_learning.py --harness claude_code    # its full ~15k-token request: slow
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from polar_pl.testing.learning import CONTROL_OVERRIDES, start_and_lead

REPO = Path(__file__).resolve().parents[1]


def run(
    experiment: str, harness: str, out: Path, steps: int, *extra: str
) -> tuple[list[dict[str, str]], float]:
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "train.py", f"experiment={experiment}", f"harness={harness}", f"steps={steps}",
            f"hydra.run.dir={out}", *extra]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    with open(out / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return [r for r in rows if r.get("rollout/reward_mean")], wall


def summary(rows: list[dict[str, str]]) -> tuple[list[float], float, float]:
    rewards = [float(r["rollout/reward_mean"]) for r in rows]
    infra = sum(float(r.get("rollout/harness_error_infra") or 0) for r in rows)
    policy = sum(float(r.get("rollout/harness_error_policy") or 0) for r in rows)
    return rewards, infra, policy


def gain(values: list[float]) -> float:
    return sum(values[-2:]) / 2 - sum(values[:2]) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--harness", default="pi", help="comma-separated harness names")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--control-steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="train.py's seed (sampling, task order)")
    ap.add_argument(
        "--experiment", default="cli_sanity", help="e.g. cli_sanity_claude_code (Claude Code's lean request)"
    )
    ap.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    ap.add_argument("overrides", nargs="*", help="train.py overrides for both runs, e.g. module.lr=2e-3")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="polar-cli-learning-"))
    print(f"{'harness':12} {'run':8} {'wall s':>7} {'infra':>6} {'policy':>6}  reward by step")
    for harness in args.harness.split(","):
        # the run's warm-started model, built once (train.py refuses to start without it)
        subprocess.run([sys.executable, "-m", "polar_pl.cli", "warm-start", f"experiment={args.experiment}",
                        f"harness={harness}", *args.overrides], cwd=REPO, check=True)  # fmt: skip
        curves = {}
        for name, steps, extra in (
            ("push", args.steps, ()),
            ("no push", args.control_steps, CONTROL_OVERRIDES),
        ):
            rows, wall = run(args.experiment, harness, root / harness / name.replace(" ", "_"), steps,
                             f"seed={args.seed}", *args.overrides, *extra)  # fmt: skip
            rewards, infra, policy = summary(rows)
            curves[name] = rewards
            print(
                f"{harness:12} {name:8} {wall:7.0f} {infra:6.0f} {policy:6.0f}  {[round(x, 3) for x in rewards]}"
            )
            if name == "push":
                for check in ("uppercase_fraction", "lowercase_fraction"):
                    values = [round(float(r[f"rollout/reward_by_check/{check}"]), 3) for r in rows]
                    print(f"{'':12} {check[:9]:8} {'':7} {'':6} {'':6}  {values}")
        push = curves["push"]
        start, lead = start_and_lead(push, curves["no push"])  # as tests/test_train.py measures it
        print(f"{harness:12} gain push {gain(push):+.3f}; push's last 3 steps lead the start "
              f"({start:.3f}) by {lead:+.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
