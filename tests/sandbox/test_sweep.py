"""The sweep at the start of a run: what a killed run left (its workspace, the harness process still
working there, its cgroup) goes; a run still going keeps its sandboxes, though both share the
sandbox owner name. After kill -9 of train.py, harness processes, sandbox folders and cgroups
stayed behind, and the next run did not sweep them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from pathlib import Path

from polar_pl.sandbox import creator
from polar_pl.sandbox.local import TMP_PREFIX, LocalSandbox
from polar_pl.sandbox.sweep import sweep

# An agent's child that outlives its command: it leaves the command's process group (setsid), and
# the command returns once it has (else killing the group at the command's end may come first).
ORPHAN = (
    "setsid sh -c 'echo $$ > ../tmp/orphan; exec sleep 600' >/dev/null 2>&1 </dev/null & "
    "while [ ! -s ../tmp/orphan ]; do sleep 0.02; done"
)
KILLED_RUN = textwrap.dedent("""
    import os, signal, sys, warnings
    warnings.simplefilter("ignore")
    from test_sweep import ORPHAN
    from polar_pl.sandbox.local import LocalSandbox
    sb = LocalSandbox(isolation="none", owner=sys.argv[1])
    sb.start()
    sb.exec(ORPHAN)
    print(sb.root, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _sleepers_in(root: str) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "cwd").startswith(root):
                out.append(int(proc.name))
        except OSError:
            pass
    return out


def test_a_killed_runs_leftovers_are_swept_and_a_live_runs_are_not():
    owner = f"sweep{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, owner], capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    dead_root = done.stdout.strip()
    orphans = _sleepers_in(dead_root)
    assert orphans and Path(dead_root).is_dir()  # what kill -9 left behind
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        live = LocalSandbox(isolation="none", owner=owner)
    live.start()
    try:
        live.exec(ORPHAN)
        (live_sleeper,) = _sleepers_in(str(live.root))
        report = sweep(owner, dead_only=True)
        assert report.workspaces == 1 and report.processes >= 1, report
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in orphans) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in orphans), "the killed run's harness process survived the sweep"
        assert not Path(dead_root).exists()
        assert live.root.is_dir() and _alive(live_sleeper), "the sweep touched a live run's sandbox"
        assert creator.alive(creator.tag()) and not creator.alive("1-0")
    finally:
        live.stop()
    assert not list(Path(dead_root).parent.glob(f"{TMP_PREFIX}{owner}-*"))
