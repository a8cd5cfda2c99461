"""Start and stop a private Docker engine (dockerd) for tests, CI and single-machine runs.

The daemon gets its own data root, exec root, pidfile and unix socket, so it never touches a
system Docker, and it is stopped by pid. Flags suit a bare VM without a bridge or iptables:
`--bridge=none --iptables=false --ip6tables=false` (sandboxes use network_mode none anyway),
storage overlay2 with a vfs fallback when overlay cannot be mounted.

    with DockerDaemon(root=".cache/dockerd") as engine:
        client = docker.DockerClient(base_url=engine.url)

`tcp="127.0.0.1:PORT"` with `tls=(ca, server cert, server key)` also listens on TCP with mutual TLS
(`--tlsverify`): how a remote Docker host is reached (clients need a certificate signed by `ca`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Self


class DockerUnavailable(RuntimeError):
    """dockerd cannot be started here (not root, not installed, or it failed to come up)."""


def install_docker() -> None:
    """apt-get install docker.io when dockerd is missing (root only)."""
    if shutil.which("dockerd"):
        return
    if os.geteuid() != 0:
        raise DockerUnavailable("dockerd is not installed and installing it needs root")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "docker.io"], check=True, env=env, capture_output=True
        )
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        raise DockerUnavailable(f"apt-get install docker.io failed: {e}") from e
    if not shutil.which("dockerd"):
        raise DockerUnavailable("docker.io installed but dockerd is not on PATH")


class DockerDaemon:
    """A dockerd owned by this process. `root` keeps images between runs (the data root lives there);
    the socket and exec root go to a short path under /run (unix socket paths are length-limited)."""

    def __init__(
        self,
        root: str | Path = ".cache/dockerd",
        storage_driver: str | None = None,
        tcp: str | None = None,
        tls: tuple[str, str, str] | None = None,
    ) -> None:
        if tcp and not tls:
            raise ValueError("a TCP socket without TLS would hand root to anyone who can connect: give tls")
        self.tcp, self.tls = tcp, tls
        self.root = Path(root).resolve()
        tag = hashlib.sha1(str(self.root).encode()).hexdigest()[:10]
        self.run_dir = Path("/run" if os.access("/run", os.W_OK) else "/tmp") / f"polar-dockerd-{tag}"
        self.sock = self.run_dir / "docker.sock"
        self.pidfile = self.run_dir / "docker.pid"
        self.log_path = self.root / "dockerd.log"
        self.storage_driver = storage_driver
        self.proc: subprocess.Popen | None = None
        self.driver: str | None = None
        self.attached = False  # True when another process's dockerd on this root is being reused

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    @property
    def tcp_url(self) -> str | None:
        return f"tcp://{self.tcp}" if self.tcp else None

    def start(self, timeout: float = 60.0) -> Self:
        if os.geteuid() != 0:
            raise DockerUnavailable("dockerd needs root")
        install_docker()
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self._ping():  # a live daemon on this root (a parallel test session): share it
            self.attached = True
            return self
        self._kill_stale()
        drivers = [self.storage_driver] if self.storage_driver else ["overlay2", "vfs"]
        errors = []
        for driver in drivers:
            try:
                self._launch(driver, timeout)
                self.driver = driver
                return self
            except DockerUnavailable as e:
                errors.append(f"{driver}: {e}")
                self.stop()
        raise DockerUnavailable("; ".join(errors))

    def _launch(self, driver: str, timeout: float) -> None:
        data_root = self.root / f"data-{driver}"
        cmd = [
            "dockerd",
            f"--data-root={data_root}",
            f"--exec-root={self.run_dir / 'exec'}",
            f"--pidfile={self.pidfile}",
            f"--host={self.url}",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--storage-driver={driver}",
            "--log-level=warn",
        ]
        if self.tcp:
            assert self.tls is not None  # __init__ refuses tcp without tls
            ca, cert, key = self.tls
            cmd += [
                f"--host=tcp://{self.tcp}",
                "--tlsverify",
                f"--tlscacert={ca}",
                f"--tlscert={cert}",
                f"--tlskey={key}",
            ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DockerUnavailable(f"dockerd exited with {self.proc.returncode}: {self._log_tail()}")
            if self._ping():
                return
            time.sleep(0.2)
        raise DockerUnavailable(f"dockerd not ready after {timeout:.0f}s: {self._log_tail()}")

    def _ping(self) -> bool:
        import docker

        if not self.sock.exists():
            return False
        try:
            client = docker.DockerClient(base_url=self.url, timeout=5)
            ok = client.ping()
            client.close()
            return bool(ok)
        except Exception:
            return False

    def _log_tail(self, n: int = 800) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _kill_stale(self) -> None:
        """A dockerd left by a crashed run on the same root: stop it so the data root is free."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        _terminate(pid)
        self.pidfile.unlink(missing_ok=True)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the daemon this object started (a shared one is left to its owner)."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
        # containerd-shims outlive dockerd by design; ours hold nothing once containers are gone.
        self.sock.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _terminate(pid: int, timeout: float = 30.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
