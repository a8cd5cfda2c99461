"""PNG plots of a run from its `csv/metrics.csv`: written at the end of every run into
`<run_dir>/plots/`, and by `polar-pl plot --run DIR` for any run directory (also one still going).

reward.png       rollout/reward_mean ± reward_std per step
pass_rate.png    rollout/pass_rate per step
merge.png        merge/compression_ratio, and chain breaks per step by kind (stacked)
busy.png         busy fraction per step of each stage pool and of the engine
logprob_gap.png  train/logprob_gap_mean: trainer pi_old vs engine behaviour logprobs
time.png         time/* breakdown of each step (stacked)

The x axis counts rollout batches (a skipped batch is a step too: Lightning's global step counts
optimiser steps and would not move on it).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from pathlib import Path

STAGES = ("init", "running", "postrun")
TIMES = ("rollout_wait_s", "old_logprobs_s", "update_s", "push_s", "other_s")


def read_steps(run_dir: str | Path) -> list[dict[str, float]]:
    """One dict per training step (rows of csv/metrics.csv that carry rollout/reward_mean)."""
    path = Path(run_dir) / "csv" / "metrics.csv"
    if not path.exists():
        raise FileNotFoundError(f"no metrics at {path} (is {run_dir} a run directory?)")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    steps = []
    for row in rows:
        values = {}
        for k, v in row.items():
            try:
                values[k] = float(v)
            except (TypeError, ValueError):
                continue
        if "rollout/reward_mean" in values:
            steps.append(values)
    return steps


def _series(steps: Sequence[dict[str, float]], key: str) -> list[float]:
    return [s.get(key, float("nan")) for s in steps]


def _figure(title: str, ylabel: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_reward(steps, x, out: Path) -> Path:
    mean, std = _series(steps, "rollout/reward_mean"), _series(steps, "rollout/reward_std")
    fig, ax = _figure("reward per step (mean ± std over the batch's attempts)", "reward")
    ax.plot(x, mean, marker="o", ms=3, label="mean")
    std = [0.0 if math.isnan(s) else s for s in std]
    lo = [m - s for m, s in zip(mean, std, strict=True)]
    hi = [m + s for m, s in zip(mean, std, strict=True)]
    ax.fill_between(x, lo, hi, alpha=0.25, label="± std")
    ax.set_ylim(bottom=min(0.0, *lo))
    ax.legend()
    return _save(fig, out / "reward.png")


def plot_pass_rate(steps, x, out: Path) -> Path:
    fig, ax = _figure("pass rate per step (reward >= 1)", "pass rate")
    ax.plot(x, _series(steps, "rollout/pass_rate"), marker="o", ms=3)
    ax.set_ylim(-0.02, 1.02)
    return _save(fig, out / "pass_rate.png")


def plot_merge(steps, x, out: Path) -> Path:
    fig, ax = _figure("prefix merge: compression ratio and chain breaks", "compression ratio")
    ax.plot(
        x,
        _series(steps, "merge/compression_ratio"),
        color="black",
        marker="o",
        ms=3,
        label="compression ratio",
    )
    kinds = sorted(
        {k.removeprefix("merge/breaks/") for s in steps for k in s if k.startswith("merge/breaks/")}
    )
    twin = ax.twinx()
    bottom = [0.0] * len(x)
    for kind in kinds:
        counts = [s.get(f"merge/breaks/{kind}", 0.0) for s in steps]
        if any(counts):
            twin.bar(x, counts, bottom=bottom, alpha=0.5, label=kind)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    twin.set_ylabel("chain breaks per step")
    twin.set_ylim(bottom=0, top=max(1.0, *bottom) * 1.1)
    lines, labels = ax.get_legend_handles_labels()
    bars, bar_labels = twin.get_legend_handles_labels()
    ax.legend(lines + bars, labels + bar_labels, fontsize=8)
    if not bars:
        ax.text(0.99, 0.02, "no chain breaks", transform=ax.transAxes, ha="right", fontsize=8)
    return _save(fig, out / "merge.png")


def plot_busy(steps, x, out: Path) -> Path:
    fig, ax = _figure("busy fraction per step", "busy")
    for stage in STAGES:
        ax.plot(x, _series(steps, f"rollout/busy_{stage}"), marker=".", label=f"{stage.upper()} pool")
    ax.plot(x, _series(steps, "rollout/engine_busy"), marker=".", label="engine", color="black")
    ax.set_ylim(-0.02, 1.05)
    ax.legend(fontsize=8)
    return _save(fig, out / "busy.png")


def plot_gap(steps, x, out: Path) -> Path:
    fig, ax = _figure("trainer vs engine logprobs on sampled tokens", "mean |pi_old - mu|")
    ax.plot(x, _series(steps, "train/logprob_gap_mean"), marker="o", ms=3, label="logprob gap")
    ax.set_ylim(bottom=0)
    twin = ax.twinx()
    twin.plot(x, _series(steps, "train/staleness_mean"), color="grey", ls="--", label="staleness (versions)")
    twin.set_ylabel("staleness")
    twin.set_ylim(bottom=0)
    lines, labels = ax.get_legend_handles_labels()
    l2, lab2 = twin.get_legend_handles_labels()
    ax.legend(lines + l2, labels + lab2, fontsize=8)
    return _save(fig, out / "logprob_gap.png")


def plot_time(steps, x, out: Path) -> Path:
    fig, ax = _figure("where each step's time went", "seconds")
    bottom = [0.0] * len(x)
    for key in TIMES:
        vals = [s.get(f"time/{key}", 0.0) for s in steps]
        ax.bar(x, vals, bottom=bottom, label=key.removesuffix("_s").replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.legend(fontsize=8)
    return _save(fig, out / "time.png")


PLOTS = (plot_reward, plot_pass_rate, plot_merge, plot_busy, plot_gap, plot_time)


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write every plot of the run; returns their paths (none when no step was logged yet)."""
    steps = read_steps(run_dir)
    if not steps:
        return []
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    x = list(range(1, len(steps) + 1))
    return [plot(steps, x, out) for plot in PLOTS]


# ---- `polar-pl plot` -------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="run directory (holds csv/metrics.csv)")
    p.add_argument("--out", default=None, help="where to write the PNGs (default: <run>/plots)")


def run(args: argparse.Namespace) -> int:
    try:
        paths = plot_run(args.run, args.out)
    except FileNotFoundError as exc:
        print(f"polar-pl plot: {exc}")
        return 2
    if not paths:
        print(f"polar-pl plot: {args.run} has no logged step yet")
        return 1
    for p in paths:
        print(p)
    return 0
