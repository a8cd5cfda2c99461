"""Pipelined vs one stage after another on the real model: `experiment=smollm2_arith`, same steps.

    .venv/bin/python bench/real_pipeline.py [--steps 6] [extra train.py overrides ...]

Runs `train.py experiment=smollm2_arith` twice in one go, without its held-out evaluations and
export (only the training loop is compared):
- one after another: `datamodule.max_groups_in_flight=0`: groups start only while the trainer
  waits for its batch, so the engine idles while the trainer updates and pushes;
- pipelined: the experiment's own setting: rollouts for step k+1 run while step k trains and
  pushes (bounded staleness, corrected by the importance ratio).
From each run's metrics.csv, over steps 2..N (step 1 holds the start-up, the same in both):
wall time (sum of time/step_s), samples/s (sessions drawn, dynamic sampling's replacements included,
per second) and the engine's busy fraction (the gateway's cumulative busy seconds over its uptime).
The last line: `pipeline: N.NNx samples/s, engine busy P% (M.MMx training steps/s)` (pipelined over
one-after-another; busy of the pipelined run; the steps/s ratio is that of the wall times).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def metrics(run: Path) -> list[dict[str, float]]:
    """Rows of the run's metrics.csv that carry a training step, numbers only."""
    (path,) = run.glob("csv/**/metrics.csv")
    with path.open() as f:
        rows = [{k: float(v) for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(f)]
    return [r for r in rows if "time/step_s" in r]


def summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    steady = rows[1:]  # step 1 holds the engine's and the sandboxes' start-up
    wall = sum(r["time/step_s"] for r in steady)
    sessions = sum(r.get("rollout/sessions", 0.0) for r in steady)
    busy = [r for r in rows if "gateway/engine_busy_s" in r and "gateway/uptime_s" in r]
    engine = (busy[-1]["gateway/engine_busy_s"] - busy[0]["gateway/engine_busy_s"]) / max(
        busy[-1]["gateway/uptime_s"] - busy[0]["gateway/uptime_s"], 1e-9
    )
    return {
        "steps": len(steady),
        "wall": wall,
        "sessions": sessions,
        "samples_s": sessions / wall,
        "engine": engine,
        "update": sum(r.get("time/update_s", 0.0) for r in steady) / len(steady),
        "wait": sum(r.get("time/rollout_wait_s", 0.0) for r in steady) / len(steady),
    }


def run(name: str, overrides: list[str], out: Path) -> dict[str, float]:
    run_dir = out / name
    cmd = [sys.executable, "train.py", "experiment=smollm2_arith", "logger=csv", f"hydra.run.dir={run_dir}",
           "~callbacks.held_out_eval", "~callbacks.export_model", *overrides]  # fmt: skip
    t0 = time.monotonic()
    with (out / f"{name}.log").open("w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    print(f"{name}: {time.monotonic() - t0:.0f} s in all, log {out / f'{name}.log'}", flush=True)
    return summarise(metrics(run_dir))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", default=None, help="where the two runs go (default: a temporary folder)")
    p.add_argument("overrides", nargs="*", help="extra train.py overrides for both runs")
    args = p.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="polar-real-pipeline-"))
    out.mkdir(parents=True, exist_ok=True)
    common = [f"steps={args.steps}", *args.overrides]
    arms = {
        "one after another": run("sequential", [*common, "datamodule.max_groups_in_flight=0"], out),
        "pipelined": run("pipelined", common, out),
    }
    table = Table(title=f"experiment=smollm2_arith, steps 2..{args.steps}, same settings but the overlap")
    for col in (
        "mode",
        "steps",
        "wall s",
        "sessions",
        "samples/s",
        "engine busy",
        "update s/step",
        "wait s/step",
    ):
        table.add_column(col, justify="right")
    for name, s in arms.items():
        table.add_row(
            name, f"{s['steps']:.0f}", f"{s['wall']:.0f}", f"{s['sessions']:.0f}", f"{s['samples_s']:.2f}",
            f"{s['engine']:.0%}", f"{s['update']:.1f}", f"{s['wait']:.1f}",
        )  # fmt: skip
    Console(width=160).print(table)
    seq, pipe = arms["one after another"], arms["pipelined"]
    # sessions drawn include dynamic sampling's replacements, which a pipelined run draws more of
    # while the trainer updates; every step trains on the same number of rows in both, so the
    # ratio of wall times is the training throughput's
    print(
        f"pipeline: {pipe['samples_s'] / seq['samples_s']:.2f}x samples/s, engine busy {pipe['engine']:.0%}"
        f" ({seq['wall'] / pipe['wall']:.2f}x training steps/s)"
    )


if __name__ == "__main__":
    main()
