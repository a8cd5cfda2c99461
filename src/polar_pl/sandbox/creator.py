"""Which process made a sandbox, so that a sweep at the start of a run removes only what dead runs
left behind, never the sandboxes of a run still going (runs on one machine share owner names).

A tag is `<pid>-<start time in clock ticks>` (from /proc): a reused pid has another start time.
Docker containers carry it with the host name (`<host>/<tag>`): a creator on another machine
cannot be checked, so its containers count as alive.
"""

from __future__ import annotations

import os
import re
import socket

_TAG = re.compile(r"^(\d+)-(\d+)$")


def _start_ticks(pid: int) -> str | None:
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read().decode()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; comm (field 2) may hold spaces


def tag() -> str:
    """This process's tag."""
    return f"{os.getpid()}-{_start_ticks(os.getpid()) or 0}"


def alive(creator: str | None) -> bool:
    """Whether the process behind a tag still runs. An unreadable or missing tag counts as alive."""
    m = _TAG.match(creator or "")
    if m is None:
        return True
    return _start_ticks(int(m.group(1))) == m.group(2)


def host_tag() -> str:
    return f"{socket.gethostname()}/{tag()}"


def host_alive(creator: str | None) -> bool:
    host, _, local = (creator or "").rpartition("/")
    return host != socket.gethostname() or alive(local)
