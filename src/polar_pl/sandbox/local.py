"""The local backend: commands run as a process group in a fresh temporary workspace on the host.

Optional isolation with bubblewrap (`isolation="bwrap"`): the whole host filesystem read-only, the
sandbox's own root (workspace, home, tmp) writable, a private /tmp, and a private network namespace
with only loopback, where a relay forwards the gateway's port to the host gateway (see relay.py).
Optional cgroup limits (memory, pids, cpus) need root; as root every sandbox gets a cgroup anyway,
so stop() kills all its processes, also those that left the process group.
Paths are the same inside and outside: the workspace is bound at its host path.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Self

from polar_pl.sandbox import cgroups, gitdiff
from polar_pl.sandbox.image import default_harness_prefix
from polar_pl.sandbox.protocol import ExecResult
from polar_pl.sandbox.relay import Relay, inside_url, unix_to_tcp

ISOLATIONS = ("none", "bwrap")
TMP_PREFIX = "polar-sbx-"
RELAY_SCRIPT = str(Path(__file__).with_name("relay.py"))


class LocalSandbox:
    """`Sandbox` on the host. `root` holds workspace/, home/, tmp/ and state/ (baseline git dir)."""

    def __init__(
        self,
        isolation: str = "none",
        memory: str | int | None = None,
        pids: int | None = None,
        cpus: float | None = None,
        owner: str = "default",
        base_dir: str | None = None,
        harness_prefix: str | None = None,
        default_timeout: float | None = None,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"sandbox.isolation={isolation!r}: allowed values are {ISOLATIONS}")
        if isolation == "bwrap" and not shutil.which("bwrap"):
            raise ValueError("sandbox.isolation='bwrap' needs bubblewrap: apt-get install bubblewrap")
        self.isolation = isolation
        self.limits = cgroups.Limits(parse_bytes(memory), pids, cpus)
        if self.limits.any and not cgroups.available():
            raise ValueError("sandbox limits (memory/pids/cpus) on the local backend need root and cgroups")
        self.owner = owner
        self.base_dir = base_dir
        self.harness_prefix = default_harness_prefix(harness_prefix)  # absolute: execs run elsewhere
        self.default_timeout = default_timeout
        self.python = [sys.executable]
        self.root: Path | None = None
        self.workdir = ""
        self.home = ""
        self._cgroup: cgroups.Cgroup | None = None
        self._relays: dict[tuple[str, int], tuple[Relay, str]] = {}
        self._pgids: set[int] = set()
        self._spawn_lock = threading.Lock()
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{self.owner}-", dir=self.base_dir))
        for sub in ("workspace", "home", "tmp", "state"):
            (self.root / sub).mkdir()
        self.workdir = str(self.root / "workspace")
        self.home = str(self.root / "home")
        # A cgroup even without limits when we may make one: stop() then kills every process the
        # sandbox started, also those that left the process group (setsid, double fork).
        if self.limits.any or cgroups.available():
            self._cgroup = cgroups.Cgroup(f"{self.owner}.{uuid.uuid4().hex[:12]}", self.limits)
        self.baseline()

    def stop(self) -> None:
        with self._spawn_lock:  # no exec may start a process between this snapshot and the kill
            self._stopped = True
            pgids = list(self._pgids)
        for pgid in pgids:
            _killpg(pgid)
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None
        for relay, _ in self._relays.values():
            relay.close()
        self._relays.clear()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- gateway -------------------------------------------------------------------------------
    def expose_gateway(self, url: str) -> str:
        """Make `url` (a gateway on this host) reachable from inside; returns the URL to use inside."""
        if self.isolation == "none":
            return url
        inside, host, port = inside_url(url)
        if (host, port) not in self._relays:
            sock = str(self._root / "state" / f"gw-{port}.sock")
            self._relays[(host, port)] = (unix_to_tcp(sock, host, port), sock)
        return inside

    # -- exec ----------------------------------------------------------------------------------
    def exec(
        self,
        command: str | list[str],
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        argv = ["bash", "-lc", command] if isinstance(command, str) else list(command)
        full_env = self._base_env() | (env or {})
        cwd = workdir or self.workdir
        if not os.path.isabs(cwd):
            cwd = os.path.join(self.workdir, cwd)
        argv = self._wrap(argv, cwd)
        timeout = timeout if timeout is not None else self.default_timeout
        t0 = time.monotonic()
        with self._spawn_lock:  # spawn and register atomically with respect to stop()
            if self._stopped:
                raise RuntimeError("sandbox is stopped: exec refused")
            proc = subprocess.Popen(
                argv,
                cwd=cwd if self.isolation == "none" else "/",
                env=full_env,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self._pgids.add(proc.pid)
        timed_out = False
        try:
            out, err = proc.communicate(stdin.encode() if stdin is not None else None, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self._kill_tree(proc.pid)
            try:  # a process that escaped the group may still hold the pipes: do not wait forever
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = b"", b""
        finally:
            self._pgids.discard(proc.pid)
            _killpg(proc.pid)  # background children of a finished command die with it
        code = proc.wait()
        return ExecResult(
            exit_code=code if code >= 0 else 128 - code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - t0,
        )

    def _base_env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TZ")}
        return keep | {
            "HOME": self.home,
            "TMPDIR": str(self._root / "tmp"),
            "USER": os.environ.get("USER", "root"),
            "PATH": keep.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        }

    def _wrap(self, argv: list[str], cwd: str) -> list[str]:
        if self.isolation == "bwrap":
            root = str(self._root)
            for (_, port), (_, sock) in self._relays.items():
                relay = [
                    sys.executable,
                    "-I",
                    "-S",
                    RELAY_SCRIPT,
                    "tcp2unix",
                    f"127.0.0.1:{port}",
                    sock,
                    "--",
                ]
                argv = relay + argv
            argv = [
                "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp", "--bind", root, root, "--unshare-net", "--unshare-pid",
                "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--chdir", cwd, "--", *argv,
            ]  # fmt: skip
        if self._cgroup is not None:
            # Join the cgroup before exec so that every descendant is limited and killable.
            joins = " ".join(f"echo $$ > {f};" for f in self._cgroup.procs_files)
            argv = ["sh", "-c", f'{joins} exec "$@"', "polar-cg", *argv]
        return argv

    def _kill_tree(self, pgid: int) -> None:
        _killpg(pgid)
        if self._cgroup is not None:
            self._cgroup.kill_all()

    # -- files ---------------------------------------------------------------------------------
    def _path(self, path: str) -> Path:
        p = Path(path) if os.path.isabs(path) else Path(self.workdir) / path
        root = self._root.resolve()
        resolved = p.resolve()
        if resolved != root and root not in resolved.parents:
            raise ValueError(f"path {path!r} is outside the sandbox root {root}")
        return p

    def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        p = self._path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(mode)

    def get_file(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    def put_archive(self, src: Path, dest: str) -> None:
        target = self._path(dest)
        target.mkdir(parents=True, exist_ok=True)
        # Through tar, not copytree, so the semantics (symlinks, modes) match the docker backend.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(src), arcname=".")
        buf.seek(0)
        with tarfile.open(fileobj=buf, mode="r") as tar:
            tar.extractall(target, filter="tar")

    def get_archive(self, src: str, dest: Path) -> None:
        shutil.copytree(self._path(src), dest, symlinks=True, dirs_exist_ok=True)

    # -- diff ----------------------------------------------------------------------------------
    def baseline(self) -> str:
        res = self.exec(["bash", "-c", gitdiff.baseline_script(self._git_dir, self.workdir)])
        if res.exit_code != 0:
            raise RuntimeError(f"baseline commit failed: {res.stderr.strip()}")
        return res.stdout.strip()

    def diff(self, exclude: tuple[str, ...] = ()) -> str:
        script = gitdiff.diff_script(self._git_dir, self.workdir, gitdiff.HARNESS_STATE_DIRS + exclude)
        res = self.exec(["bash", "-c", script])
        if res.exit_code != 0:
            raise RuntimeError(f"workspace diff failed: {res.stderr.strip()}")
        return res.stdout

    @property
    def _git_dir(self) -> str:
        return str(self._root / "state" / "baseline.git")

    @property
    def _root(self) -> Path:
        if self.root is None:
            raise RuntimeError("sandbox not started (call start() first)")
        return self.root


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def parse_bytes(value: str | int | None) -> int | None:
    """'512m' / '2g' / 1048576 -> bytes (docker's notation)."""
    if value is None or isinstance(value, int):
        return value
    s = str(value).strip().lower().removesuffix("b")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
    return int(float(s.rstrip("kmg")) * mult)


def sweep_local(owner: str | None = None, base_dir: str | None = None) -> int:
    """Remove leftover temporary workspaces of `owner` (all owners when None); returns the count."""
    base = Path(base_dir or tempfile.gettempdir())
    n = 0
    for d in base.glob(f"{TMP_PREFIX}{owner + '-' if owner else ''}*"):
        shutil.rmtree(d, ignore_errors=True)
        n += 1
    return n
