"""`polar-pl sandbox dockerd` as a real process: stopped with SIGTERM or SIGINT, it stops its dockerd
(SIGTERM used to end the command at once and leave the daemon running, owned by nobody)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixture_paths import REPO

from polar_pl.sandbox.dockerd import DockerDaemon, _terminate


def _alive(pid: int) -> bool:
    """A zombie counts as gone: in a container, PID 1 may never reap an orphan."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_commands_dockerd(tmp_path, sig):
    """The failure: SIGTERM (what `kill`, systemd and Kubernetes send) ended the command without
    its cleanup, and its dockerd (own session, so not signalled with it) ran on."""
    if os.geteuid() != 0:
        pytest.skip("the private dockerd needs root")
    if not shutil.which("dockerd"):
        pytest.skip("dockerd is not installed (make docker-deps)")
    root = tmp_path / "dockerd"
    daemon = DockerDaemon(root=root)  # the paths the command's daemon uses
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar_pl.cli", "sandbox", "dockerd", "--dockerd-root", str(root)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    pid = None
    try:
        assert proc.stdout is not None
        out = []
        for line in proc.stdout:  # ends when the command exits
            out.append(line)
            if line.startswith("export DOCKER_HOST="):
                break
        assert out and out[-1].startswith("export DOCKER_HOST="), "".join(out)
        pid = int(daemon.pidfile.read_text())
        assert _alive(pid)
        proc.send_signal(sig)
        proc.wait(90)
        assert _gone_within(pid, 60), f"dockerd {pid} still runs after the command ended on {sig.name}"
        assert not daemon.sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if pid is not None and _alive(pid):
            _terminate(pid)
