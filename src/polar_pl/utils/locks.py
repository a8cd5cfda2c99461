"""A lock file beside a cache entry, so that processes building the same entry (parallel test
workers, two runs on one machine) build it once and never see it half-written."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on `.<name>.lock` beside `target` (released on exit or death)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
