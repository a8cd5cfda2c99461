"""The first run (`make train`: experiment=first_run) on N seeds: minutes, held-out before and
after, and the paired gain with its 95% interval, one line per seed.

    .venv/bin/python bench/first_run.py [--seeds 1,2,3,4,5] [--make] [extra train.py overrides ...]

Each seed is one `python train.py seed=N` (the default recipe) in a run folder of its own, one after
another (two at once would share the cores and time neither). --make runs `make train ARGS=...`
instead, the README's command, its install steps included (a second run installs nothing). Read
from each run's `eval/comparison.json` (the held-out evaluation's paired comparison). The last line:

    first run: median M.M min, gains G1..Gn, all intervals above 0: yes/no
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class SeedResult:
    seed: int
    minutes: float
    before: str
    after: str
    gain: float
    low: float
    high: float

    def line(self) -> str:
        return (
            f"seed {self.seed}: {self.minutes:.1f} min, before {self.before}, after {self.after}, "
            f"paired gain {self.gain:+.1f} [{self.low:+.1f}, {self.high:+.1f}]"
        )


def run_seed(seed: int, out: Path, make: bool, extra: list[str]) -> SeedResult:
    run = out / f"seed{seed}"
    overrides = [f"seed={seed}", f"hydra.run.dir={run}", *extra]
    cmd = (
        ["make", "train", f"ARGS={' '.join(overrides)}"] if make else [sys.executable, "train.py", *overrides]
    )
    t0 = time.perf_counter()
    with open(out / f"seed{seed}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    minutes = (time.perf_counter() - t0) / 60
    comparison = run / "eval" / "comparison.json"
    if rc != 0 or not comparison.exists():
        sys.exit(f"first_run: seed {seed} failed (exit {rc}); its log: {out / f'seed{seed}.log'}")
    c = json.loads(comparison.read_text())
    d = c["pass@1_diff"]
    before, after = (_pass1(c[k]) for k in ("a", "b"))
    return SeedResult(seed, minutes, before, after, 100 * d["mean"], 100 * d["low"], 100 * d["high"])


def _pass1(report: dict) -> str:
    e = report["pass_at_k"]["1"]  # fractions: printed in points
    return f"{100 * e['mean']:.1f} [{100 * e['low']:.1f}, {100 * e['high']:.1f}]"


def summary(results: list[SeedResult]) -> str:
    gains = ", ".join(f"{r.gain:+.1f}" for r in results)
    above = "yes" if all(r.low > 0 for r in results) else "no"
    median = statistics.median(r.minutes for r in results)
    return f"first run: median {median:.1f} min, gains {gains}, all intervals above 0: {above}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds, run one after another")
    parser.add_argument("--make", action="store_true", help="run `make train ARGS=...` (installs included)")
    parser.add_argument("--out", type=Path, default=None, help="run folders and logs (default: a temp dir)")
    args, extra = parser.parse_known_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="first_run-"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        results.append(run_seed(seed, out, args.make, extra))
        print(results[-1].line(), flush=True)
    print(summary(results))


if __name__ == "__main__":
    main()
