"""Admin tokens for the gateway and engine CLIs: from a file or the environment, never from a
command line (every process on the host can read `/proc/<pid>/cmdline`)."""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path

ENV = "POLAR_ADMIN_TOKEN"


def new_token() -> str:
    return secrets.token_urlsafe(24)


def admin_token(path: str | os.PathLike | None, *, create: bool = False) -> str | None:
    """The token in `path` (its first line) when a path is given, else $POLAR_ADMIN_TOKEN, else None.
    create: a missing file gets a new random token, readable by its owner only."""
    if path is None:
        return os.environ.get(ENV) or None
    p = Path(path)
    if create and not p.exists():
        token = new_token()
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token
    lines = p.read_text().split()
    if not lines:
        raise ValueError(f"--admin-token-file {p}: the file is empty")
    return lines[0]


class _Refuse(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"{option_string} would put the token on the command line, which every process on the "
            f"host can read (/proc/<pid>/cmdline): use --admin-token-file PATH or ${ENV}"
        )


def add_arguments(parser: argparse.ArgumentParser, help: str) -> None:
    """--admin-token-file PATH; --admin-token VALUE is refused with the reason."""
    parser.add_argument("--admin-token-file", default=None, metavar="PATH", help=help)
    parser.add_argument("--admin-token", action=_Refuse, help=argparse.SUPPRESS)
