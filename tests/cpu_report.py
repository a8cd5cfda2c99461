"""`pytest --cpu-report FILE`: each test's CPU seconds, one JSON line per test appended to FILE.

The suite is CPU-bound on the 2-core machine (both cores busy from its first test to its last), so
its length follows the CPU its tests spend, not their wall time (`--durations`, which mostly shows
who waited longest). A test's figure counts its worker process and every child the test waited for
(train.py runs and everything they waited for, vLLM servers, CLIs). It misses processes left to
init (a sandbox's, when the sandbox is killed: BSD process accounting, `accton`, sees those) and
credits a long-lived child (a module's server, dockerd) to the test during which it was reaped.
Summed per file: `python tests/cpu_report.py FILE`.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-report", metavar="FILE", help="append each test's CPU seconds to FILE (JSON lines)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("cpu_report")
    if not path:  # not asked: nothing measured
        yield
        return
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    yield
    line = {
        "test": item.nodeid,
        "cpu_s": round(cpu_seconds() - cpu0, 2),
        "wall_s": round(time.monotonic() - wall0, 2),
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def summary(path: Path, top: int = 40) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_file: dict[str, float] = defaultdict(float)
    for r in rows:
        by_file[r["test"].split("::")[0]] += r["cpu_s"]
    total = sum(by_file.values())
    out = [f"{len(rows)} tests, {total:.0f} CPU s"]
    out += [f"{s:8.1f}  {f}" for f, s in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]]
    out += ["slowest tests by CPU:"]
    out += [
        f"{r['cpu_s']:8.1f} cpu {r['wall_s']:7.1f} wall  {r['test']}"
        for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]
    ]
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
