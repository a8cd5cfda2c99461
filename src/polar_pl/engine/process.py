"""A server subprocess with a health check: started in its own process group, polled until
`GET /health` answers, stopped with SIGTERM then SIGKILL. Its output goes to a log file whose tail
is quoted when it fails to come up."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx


class ServerProcess:
    def __init__(self, cmd: list[str], url: str, *, env: dict[str, str] | None = None, name: str = "server"):
        self.cmd = cmd
        self.url = url
        self.env = env
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix=f"polar-{name}-", suffix=".log")[1])

    def start(self, timeout: float) -> None:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if healthy(self.url):
                return
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{self.name} not healthy after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, grace: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False
