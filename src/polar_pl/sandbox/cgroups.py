"""Memory / pid / CPU limits for the local backend through cgroups (v1 or v2), when writable.

Docker applies the same limits itself; the local backend does it here so that one runaway harness
cannot take the machine. A cgroup also gives a reliable "kill everything": processes that left
the process group (setsid, daemons) are still in the cgroup.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "polar_pl"


@dataclass(frozen=True, slots=True)
class Limits:
    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.memory_bytes, self.pids, self.cpus))


def _is_v2() -> bool:
    return (ROOT / "cgroup.controllers").exists()


def available() -> bool:
    """True when this process may create cgroups (root with a writable hierarchy)."""
    if os.geteuid() != 0:
        return False
    if _is_v2():
        return os.access(ROOT, os.W_OK)
    return all(os.access(ROOT / c, os.W_OK) for c in ("memory", "pids", "cpu"))


class Cgroup:
    """One cgroup per sandbox; `procs_files` are what a new process writes its pid into."""

    def __init__(self, name: str, limits: Limits) -> None:
        self.v2 = _is_v2()
        if self.v2:
            parent = ROOT / PARENT
            parent.mkdir(exist_ok=True)
            for d in (ROOT, parent):
                try:
                    (d / "cgroup.subtree_control").write_text("+memory +pids +cpu")
                except OSError:
                    pass  # already enabled or not delegable; limits below then fail loudly
            self.dirs = [parent / name]
        else:
            self.dirs = [ROOT / c / PARENT / name for c in ("memory", "pids", "cpu")]
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        self._apply(limits)

    def _write(self, controller: str, file: str, value: str) -> None:
        d = self.dirs[0] if self.v2 else ROOT / controller / PARENT / self.dirs[0].name
        (d / file).write_text(value)

    def _apply(self, limits: Limits) -> None:
        if not limits.any:
            return
        if self.v2:
            if limits.memory_bytes:
                self._write("memory", "memory.max", str(limits.memory_bytes))
                self._write("memory", "memory.swap.max", "0")
            if limits.pids:
                self._write("pids", "pids.max", str(limits.pids))
            if limits.cpus:
                self._write("cpu", "cpu.max", f"{int(limits.cpus * 100_000)} 100000")
            return
        if limits.memory_bytes:
            self._write("memory", "memory.limit_in_bytes", str(limits.memory_bytes))
            try:  # no swap either, else the limit only slows the process down
                self._write("memory", "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            except OSError:
                pass
        if limits.pids:
            self._write("pids", "pids.max", str(limits.pids))
        if limits.cpus:
            self._write("cpu", "cpu.cfs_period_us", "100000")
            self._write("cpu", "cpu.cfs_quota_us", str(int(limits.cpus * 100_000)))

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files:
            try:
                out.update(int(x) for x in Path(f).read_text().split())
            except OSError:
                pass
        return sorted(out)

    def kill_all(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def sweep(owner: str | None = None, *, dead_only: bool = False) -> tuple[int, int]:
    """Remove leftover polar_pl cgroups of `owner` (all when None) after a crash, killing what
    still runs in them; dead_only: only those whose creating process is gone (named
    `<owner>.<creator tag>.<id>`). Returns (cgroups, processes killed)."""
    from polar_pl.sandbox import creator

    groups = killed = 0
    parents = [ROOT / PARENT] if _is_v2() else [ROOT / c / PARENT for c in ("memory", "pids", "cpu")]
    for parent in parents:
        if not parent.is_dir():
            continue
        for d in parent.iterdir():
            if not d.is_dir() or (owner is not None and not d.name.startswith(f"{owner}.")):
                continue
            parts = d.name.split(".")
            if dead_only and creator.alive(parts[-2] if len(parts) >= 3 else None):
                continue
            for pid in (d / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
            try:
                d.rmdir()
                groups += 1
            except OSError:
                pass
    return groups, killed
