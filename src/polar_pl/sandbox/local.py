"""The local backend: commands run as a process group in a fresh temporary workspace on the host.

`isolation="bwrap"` (the default): every exec is a bubblewrap sandbox (bwrap.py: a view of only the
runtime, read-only, plus this sandbox's workspace, home and tmp; uid 1000 without capabilities, host
`nobody` when run by root; a private network namespace with only loopback, where a relay forwards the
gateway's port to the host gateway, see relay.py). `isolation="none"` runs commands as the calling
user on the host, with its network and filesystem: for trusted code only (`sandbox=unsafe_local`).
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
import warnings
from pathlib import Path
from typing import Self

from polar_pl.sandbox import bwrap, cgroups, creator, gitdiff, userns
from polar_pl.sandbox.image import mounted_harness_prefix
from polar_pl.sandbox.protocol import ExecResult
from polar_pl.sandbox.relay import Relay, inside_url, unix_to_tcp

ISOLATIONS = ("bwrap", "none")
TMP_PREFIX = "polar-sbx-"
CREATOR_FILE = ".creator"


class UnsafeSandboxWarning(UserWarning):
    """A sandbox without isolation: the agent runs as the calling user (root in CI) on the host."""


class LocalSandbox:
    """`Sandbox` on the host. `root` holds workspace/, home/, tmp/ and state/ (baseline git dir)."""

    def __init__(
        self,
        isolation: str = "bwrap",
        memory: str | int | None = None,
        pids: int | None = None,
        cpus: float | None = None,
        owner: str = "default",
        base_dir: str | None = None,
        harness_prefix: str | None = None,
        default_timeout: float | None = None,
        python_packages: tuple[str, ...] | list[str] = (),
        workspace_alias: str | None = None,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"sandbox.isolation={isolation!r}: allowed values are {ISOLATIONS}")
        if isolation == "bwrap" and not shutil.which("bwrap"):
            raise ValueError(
                "sandbox.isolation='bwrap' needs bubblewrap: apt-get install bubblewrap "
                "(or sandbox=docker; sandbox=unsafe_local runs the agent unisolated on the host)"
            )
        if isolation == "none":
            warnings.warn(
                "sandbox isolation is off (sandbox=unsafe_local): the agent runs as "
                f"{'root' if os.geteuid() == 0 else 'you'} on this host, with its files, processes and network",
                UnsafeSandboxWarning,
                stacklevel=2,
            )
        if workspace_alias is not None:
            _check_alias(workspace_alias, isolation)
        self.workspace_alias = workspace_alias
        self.isolation = isolation
        self.limits = cgroups.Limits(parse_bytes(memory), pids, cpus)
        if self.limits.any and not cgroups.available():
            warnings.warn(
                "sandbox.memory/pids/cpus need root and a writable cgroup hierarchy: running without them",
                stacklevel=2,
            )
            self.limits = cgroups.Limits()
        self.owner = owner
        self.base_dir = base_dir
        self.harness_prefix = mounted_harness_prefix(
            harness_prefix
        )  # absolute (execs run elsewhere); None if absent
        self.default_timeout = default_timeout
        self._runtime = bwrap.runtime(tuple(python_packages)) if isolation == "bwrap" else None
        # As root the sandbox user is host nobody, which must own the writable part of the sandbox.
        self._owner = (bwrap.NOBODY, bwrap.NOBODY) if self._runtime and os.geteuid() == 0 else None
        if self._runtime is None:
            self.python = [sys.executable]
        elif python_packages:
            self.python = ["env", f"PYTHONPATH={bwrap.PYDEPS_IN}", self._runtime.python]
        else:
            self.python = [self._runtime.python]
        self.root: Path | None = None
        self.workdir = ""
        self.home = ""
        self._cgroup: cgroups.Cgroup | None = None
        self._relays: dict[tuple[str, int], tuple[Relay, str, int]] = {}  # -> relay, socket, port inside
        self._pgids: set[int] = set()
        self._spawn_lock = threading.Lock()
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{self.owner}-", dir=self.base_dir))
        (self.root / CREATOR_FILE).write_text(creator.tag())  # a sweep leaves a live run's sandboxes
        for sub in ("workspace", "home", "tmp", "state", "run"):
            (self.root / sub).mkdir()
            if sub != "run":
                self._chown(self.root / sub)
        for name, text in bwrap.passwd_files().items():
            (self.root / "run" / name).write_text(text)
        self.workdir = str(self.root / "workspace")
        self.home = str(self.root / "home")
        # A cgroup even without limits when we may make one: stop() then kills every process the
        # sandbox started, also those that left the process group (setsid, double fork).
        if self.limits.any or cgroups.available():
            self._cgroup = cgroups.Cgroup(
                f"{self.owner}.{creator.tag()}.{uuid.uuid4().hex[:12]}", self.limits
            )
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
        for relay, _, _ in self._relays.values():
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
        inside, host, port, port_in = inside_url(url, shift_privileged=True)
        if (host, port) not in self._relays:
            sock = str(self._root / "run" / f"gw-{port}.sock")
            self._relays[(host, port)] = (unix_to_tcp(sock, host, port), sock, port_in)
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
        return self._run(command, env=env, workdir=workdir, timeout=timeout, stdin=stdin)

    def _run(
        self,
        command: str | list[str],
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
        system: bool = False,
    ) -> ExecResult:
        """exec; `system` also binds state/ (the baseline git dir), which the agent never sees."""
        argv = ["bash", "-lc", command] if isinstance(command, str) else list(command)
        full_env = self._base_env() | (env or {})
        cwd = workdir or self.workdir
        if not os.path.isabs(cwd):
            cwd = os.path.join(self.workdir, cwd)
        if (
            self.workspace_alias
            and not system
            and (cwd == self.workdir or cwd.startswith(self.workdir + "/"))
        ):
            cwd = self.workspace_alias + cwd[len(self.workdir) :]
        argv, fds = self._wrap(argv, cwd, system)
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
                pass_fds=fds,
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
        user = "polar" if self._runtime else os.environ.get("USER", "root")
        return keep | {
            "HOME": self.home,
            "TMPDIR": str(self._root / "tmp"),
            "USER": user,
            "LOGNAME": user,
            "PATH": keep.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        }

    def _wrap(self, argv: list[str], cwd: str, system: bool) -> tuple[list[str], tuple[int, ...]]:
        """(command line, file descriptors it inherits)."""
        fds: tuple[int, ...] = ()
        if self._runtime is not None:
            root = self._root
            for _, sock, port in () if system else self._relays.values():  # baseline/diff need no gateway
                relay = [
                    self._runtime.python,
                    "-I",
                    "-S",
                    bwrap.RELAY_IN,
                    "tcp2unix",
                    f"127.0.0.1:{port}",
                    sock,
                    "--",
                ]
                argv = relay + argv
            ns = userns.namespaces(*self._owner) if self._owner else None
            fds = ns or ()
            writable = [str(root / d) for d in ("workspace", "home", "tmp", *(("state",) if system else ()))]
            aliases = [(self.workdir, self.workspace_alias)] if self.workspace_alias else []
            readonly = [(str(root / "run"), str(root / "run"))] + [
                (str(root / "run" / name), f"/etc/{name}") for name in ("passwd", "group")
            ]
            argv = [
                *bwrap.argv(
                    self._runtime,
                    writable=writable,
                    readonly=readonly,
                    aliases=aliases,
                    harness_prefix=self.harness_prefix,
                    cwd=cwd,
                    userns=ns,
                ),
                *argv,
            ]
        if self._cgroup is not None:
            # Join the cgroup before exec so that every descendant is limited and killable.
            joins = " ".join(f"echo $$ > {f};" for f in self._cgroup.procs_files)
            argv = ["sh", "-c", f'{joins} exec "$@"', "polar-cg", *argv]
        return argv, fds

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

    def _chown(self, path: Path) -> None:
        if self._owner is not None:
            os.chown(path, *self._owner, follow_symlinks=False)

    def _mkdirs(self, path: Path) -> None:
        """mkdir -p, each new folder owned by the sandbox user."""
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            self._chown(p)

    def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        p = self._path(path)
        self._mkdirs(p.parent)
        p.write_bytes(data)
        self._chown(p)
        p.chmod(mode)

    def get_file(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    def put_archive(self, src: Path, dest: str) -> None:
        target = self._path(dest)
        self._mkdirs(target)
        owner = self._owner

        def owned(info: tarfile.TarInfo, where: str) -> tarfile.TarInfo:
            info = tarfile.tar_filter(info, where)
            return info.replace(uid=owner[0], gid=owner[1], uname="", gname="") if owner else info

        # Through tar, not copytree, so the semantics (symlinks, modes) match the docker backend.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(src), arcname=".")
        buf.seek(0)
        with tarfile.open(fileobj=buf, mode="r") as tar:
            tar.extractall(target, filter=owned, numeric_owner=True)
        self._chown(target)

    def get_archive(self, src: str, dest: Path) -> None:
        shutil.copytree(self._path(src), dest, symlinks=True, dirs_exist_ok=True)

    # -- diff ----------------------------------------------------------------------------------
    def baseline(self) -> str:
        res = self._run(["bash", "-c", gitdiff.baseline_script(self._git_dir, self.workdir)], system=True)
        if res.exit_code != 0:
            raise RuntimeError(f"baseline commit failed: {res.stderr.strip()}")
        return res.stdout.strip()

    def diff(self, exclude: tuple[str, ...] = ()) -> str:
        script = gitdiff.diff_script(self._git_dir, self.workdir, gitdiff.HARNESS_STATE_DIRS + exclude)
        res = self._run(["bash", "-c", script], system=True)
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


# Where a workspace alias may not go: the sandbox's runtime and system folders.
_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/proc", "/dev", "/tmp", "/opt", "/run")


def _check_alias(alias: str, isolation: str) -> None:
    """`sandbox.workspace_alias` is a fresh absolute folder inside a bubblewrap sandbox."""
    if isolation != "bwrap":
        raise ValueError(
            f"sandbox.workspace_alias={alias!r} needs sandbox.isolation='bwrap' (a mount inside the sandbox)"
        )
    norm = os.path.normpath(alias)
    if not os.path.isabs(alias) or norm != alias or norm == "/":
        raise ValueError(f"sandbox.workspace_alias={alias!r} must be a normalised absolute path, not /")
    if any(norm == p or norm.startswith(p + "/") for p in _SYSTEM_PATHS):
        raise ValueError(
            f"sandbox.workspace_alias={alias!r} is inside a system folder ({', '.join(_SYSTEM_PATHS)})"
        )


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


def sweep_local(
    owner: str | None = None, base_dir: str | None = None, *, dead_only: bool = False
) -> tuple[int, int]:
    """Remove leftover temporary workspaces of `owner` (all owners when None) and kill the
    processes still working in them (an unisolated harness outlives its run); dead_only: only
    those whose creating process is gone. Returns (workspaces, processes)."""
    base = Path(base_dir or tempfile.gettempdir())
    roots = [
        d
        for d in base.glob(f"{TMP_PREFIX}{owner + '-' if owner else ''}*")
        if not dead_only or not creator.alive(_read(d / CREATOR_FILE))
    ]
    killed = _kill_working_in(roots)
    for d in roots:
        shutil.rmtree(d, ignore_errors=True)
    return len(roots), killed


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _kill_working_in(roots: list[Path]) -> int:
    """SIGKILL every process whose working directory is inside one of `roots`."""
    if not roots:
        return 0
    prefixes = tuple(f"{r.resolve()}/" for r in roots)
    n = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd") + "/"
        except OSError:
            continue
        if cwd.startswith(prefixes):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                n += 1
            except (ProcessLookupError, PermissionError):
                pass
    return n
