"""Chaos during short training runs, and prompt shutdown (src/polar_pl/shutdown.py).

On SIGTERM the run went on (new harnesses started 30 s and 48 s later), exited after 127 s (200 s
with a hanging harness) and was finalised as "success" with no checkpoint; after kill -9 its
harness processes, sandbox folders and cgroups stayed, and the next run did not sweep them.

One test, three runs of `train.py experiment=tiny debug=fast` sharing a sandbox owner:
  a. a harness is killed (the run goes on), then the engine (its own process here): the run ends
     by itself, non-zero, with nothing left behind;
  b. train.py itself is killed -9 mid-run (the gateway dies with it);
  c. the next run says what it swept of b's leftovers; SIGTERM then ends it in under 30 s with a
     checkpoint, exit code 143 and nothing left behind.
After each run every session's calls are recorded exactly once (call indices 0..n-1, no repeat).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from fixture_paths import REPO

from polar_pl.gateway.store.traces import read_records
from polar_pl.testing.sandbox import leftovers


def start(run: Path, owner: str, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true", "POLAR_SANDBOX_OWNER": owner}
    log = open(f"{run}.log", "w")
    return subprocess.Popen(
        [sys.executable, "train.py", "experiment=tiny", "debug=fast", "steps=50", f"hydra.run.dir={run}", *overrides],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def wait_for(proc: subprocess.Popen, run: Path, text: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = Path(f"{run}.log").read_text()
        if text in log:
            return log
        assert proc.poll() is None, f"run ended (rc {proc.returncode}) before {text!r}:\n{log[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} after {timeout} s:\n{log[-3000:]}")


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every process below `pid`."""
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    out = {}
    for p in found:
        try:
            out[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            pass
    return out


def kill_one(proc: subprocess.Popen, marker: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hits = [p for p, cmd in descendants(proc.pid).items() if marker in cmd and "bwrap" not in cmd]
        if hits:
            os.kill(hits[0], signal.SIGKILL)
            return
        time.sleep(0.1)
    raise AssertionError(f"no {marker!r} process under the run")


def assert_recorded_once(run: Path) -> int:
    by_session: dict[str, list[int]] = {}
    for rec in read_records(run / "traces.db"):
        by_session.setdefault(rec.session_id, []).append(rec.call_index)
        if rec.status == "ok":
            assert rec.response_ids and len(rec.response_logprobs) == len(rec.response_ids)
    for sid, idx in by_session.items():
        assert sorted(idx) == list(range(len(idx))), f"session {sid}: calls {sorted(idx)}"
    return sum(len(v) for v in by_session.values())


@pytest.mark.slow
def test_kills_end_runs_cleanly_and_sigterm_ends_one_within_30s(tiny_model_dir, tmp_path):
    owner = f"chaos{uuid.uuid4().hex[:8]}"
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"

    run = start(a, owner, "engine.mode=subprocess", "datamodule.engine_down_s=3")
    wait_for(run, a, "step 1/")
    kill_one(run, "mini_agent.py")
    wait_for(run, a, "step 2/")  # a dead harness is one failed rollout
    kill_one(run, "polar_pl.cli engine")
    assert run.wait(120) != 0
    assert "engine" in Path(f"{a}.log").read_text().split("step 2/")[-1]
    assert not leftovers(owner), leftovers(owner)
    assert assert_recorded_once(a) > 0

    run = start(b, owner)
    wait_for(run, b, "step 1/")
    run.kill()
    run.wait(60)
    assert_recorded_once(b)
    left = leftovers(owner)

    run = start(c, owner)
    log = wait_for(run, c, "step 1/")
    assert not left or "swept what earlier runs of sandbox owner" in log
    t0 = time.monotonic()
    run.send_signal(signal.SIGTERM)
    rc = run.wait(60)
    took = time.monotonic() - t0
    print(f"SIGTERM -> exit {rc} in {took:.1f} s; left by kill -9: {len(left)}")
    assert rc == 128 + signal.SIGTERM and took < 30
    assert (c / "checkpoints" / "last.ckpt").exists()
    assert "stopped by a signal" in Path(f"{c}.log").read_text()
    assert not leftovers(owner), leftovers(owner)
    assert_recorded_once(c)
