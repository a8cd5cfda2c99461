"""OpenMP spin-waiting when more torch processes than cores share the machine (`make test`).

torch's CPU wheels use GNU OpenMP, whose idle worker threads spin (~300 k iterations, by default)
before they sleep. One process per core loses nothing to it; several processes on the same cores
(the test suite's xdist workers, each with its engines, trainers and vLLM) spend their time slices
spinning while the thread they wait on is off the CPU. This bench runs `--procs` copies of one
small-op workload (forward and backward of a stack of 128-wide linear layers, the tiny model's
width) at once, and one copy alone, under each setting, side by side, and prints the wall of each
against the default's:

    python bench/omp_spin.py                    # 4 copies on this machine's cores
    python bench/omp_spin.py --procs 3 --settings GOMP_SPINCOUNT=1000 OMP_WAIT_POLICY=PASSIVE
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

WORK = """
import torch
torch.manual_seed(0)
m = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(8)])
x = torch.randn(64, 128)
for _ in range({iters}):
    m(x).sum().backward()
"""


def wall(setting: str, procs: int, iters: int) -> float:
    """Seconds until `procs` copies of the workload, started together under `setting`, all end."""
    env = dict(os.environ)
    for kv in filter(None, setting.split()):
        key, _, value = kv.partition("=")
        env[key] = value
    t0 = time.perf_counter()
    children = [
        subprocess.Popen([sys.executable, "-c", WORK.format(iters=iters)], env=env) for _ in range(procs)
    ]
    if any(child.wait() for child in children):
        raise SystemExit(f"a workload under {setting or 'default'} failed")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2 * (os.cpu_count() or 1))
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--settings", nargs="*", default=["GOMP_SPINCOUNT=1000", "OMP_WAIT_POLICY=PASSIVE"])
    args = parser.parse_args()
    table = Table(title=f"{args.procs} copies at once vs one alone, {os.cpu_count()} cores")
    for col in ("setting", "alone s", "x alone", f"{args.procs} at once s", "x at once"):
        table.add_column(col)
    base: tuple[float, float] | None = None
    for setting in ["", *args.settings]:
        alone, crowd = wall(setting, 1, args.iters), wall(setting, args.procs, args.iters)
        base = base or (alone, crowd)
        table.add_row(setting or "default", f"{alone:.1f}", f"{alone / base[0]:.2f}", f"{crowd:.1f}",
                      f"{crowd / base[1]:.2f}")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
