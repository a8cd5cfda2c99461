"""The Sandbox protocol: where a harness runs and where evaluation runs.

Backends: `local` (process group in a temporary workspace, optional bubblewrap) and `docker`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0


@runtime_checkable
class Sandbox(Protocol):
    """An isolated workspace with a shell.

    `workdir` is the workspace path as seen inside the sandbox (commands run there by default).
    `home` is a writable folder outside the workspace ($HOME of every exec): harness state goes there.
    """

    workdir: str
    home: str

    def start(self) -> None:
        """Called once before any other method: create the workspace / container."""

    def exec(
        self,
        command: str | list[str],
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        """Run a command (a string goes through `bash -lc`); a timeout kills the whole process tree."""

    def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write one file; relative paths are under workdir."""

    def get_file(self, path: str) -> bytes:
        """Read one file; relative paths are under workdir."""

    def put_archive(self, src: Path, dest: str) -> None:
        """Copy a host directory tree into the sandbox at dest."""

    def get_archive(self, src: str, dest: Path) -> None:
        """Copy a sandbox directory tree out to the host at dest."""

    def baseline(self) -> str:
        """Commit the workspace as it is now as the diff baseline; called by task preparation after
        the repository snapshot is copied in. Returns the baseline commit id."""

    def diff(self, exclude: tuple[str, ...] = ()) -> str:
        """Unified git diff of the workspace against its baseline commit (new files included;
        harness state folders such as .claude, .codex, .polar always excluded)."""

    def expose_gateway(self, url: str) -> str:
        """Make a gateway on this host reachable from inside (the only network a network-less
        sandbox gets); returns the URL to use inside (host 127.0.0.1, same port and path)."""

    def stop(self) -> None:
        """Called once at the end, also after errors: kill everything and remove the workspace."""
