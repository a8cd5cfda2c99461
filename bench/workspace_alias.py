"""One working-folder path in every sandbox (`sandbox.workspace_alias`) vs each sandbox's own, on
pi's held-out tool tasks with the real model: wall time of the same evaluation both ways.

    .venv/bin/python bench/workspace_alias.py [--model DIR] [--tasks 32] [--out DIR]

pi writes its working folder into its system prompt, ~600 of its ~1,450 tokens in, before its tool
schemas: with each sandbox's own folder every session's first call prefills the ~830 tokens after
it; with one path for all the prefix cache serves the request up to the task. Runs `polar-pl eval
experiment=smollm2_tools` on the first `--tasks` held-out tasks, one attempt each, with the alias
and then without it (same model, same tasks), and prints both wall times, the first call's mean
latency each way and the ratio. Needs pi installed (POLAR_HARNESS_PREFIX) and the cold-started
model (`polar-pl warm-start experiment=smollm2_tools`).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("POLAR_MODEL_CACHE", ROOT / ".cache"))


def first_call_latency(db: Path) -> float:
    with sqlite3.connect(db) as c:
        rows = [json.loads(d) for (d,) in c.execute("select data from records where call_index = 0")]
    return sum(r["latency_s"] for r in rows) / max(1, len(rows))


def evaluate(model: str, tasks: int, out: Path, alias: str) -> tuple[float, float, str]:
    argv = [
        str(ROOT / ".venv/bin/polar-pl"), "eval", "experiment=smollm2_tools", f"model_dir={model}",
        f"eval.limit={tasks}", "eval.n=1", "eval.ks=[1]", f"eval.output_dir={out}", f"sandbox.workspace_alias={alias}",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"polar-pl eval failed ({alias}):\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return wall, first_call_latency(out / "traces.db"), f"{summary['passed']}/{summary['attempts']} passed"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(CACHE / "smollm2-135m-instruct-pi-tools"))
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-alias-"))
    results = {}
    for alias in ("/workspace", "null"):
        results[alias] = evaluate(args.model, args.tasks, out / alias.strip("/"), alias)
        wall, first, summary = results[alias]
        print(
            f"workspace_alias={alias}: {args.tasks} sessions in {wall:.0f} s, first call {first:.1f} s mean; {summary}"
        )
    ratio = results["null"][0] / results["/workspace"][0]
    print(f"workspace alias: {ratio:.2f}x faster evaluation ({args.tasks} pi sessions, one attempt each)")


if __name__ == "__main__":
    main()
