"""A lock file beside a cache entry, so that processes building the same entry (parallel test
workers, two runs on one machine) build it once and never see it half-written."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on `.<name>.lock` beside `target` (released on exit or death)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_dir(out_dir: str | os.PathLike[str], if_missing: bool, fill: Callable[[Path], None]) -> Path:
    """`fill` a fresh directory beside `out_dir`, then swap it in, under a lock on `out_dir`: a
    reader never sees a half-written directory. if_missing: an existing `out_dir` (one with a
    config.json) is left as it is, checked under the lock."""
    out = Path(out_dir).resolve()
    with file_lock(out):
        if if_missing and (out / "config.json").exists():
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            fill(tmp)
            _make_readable(tmp)
            _swap_in(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _make_readable(out: Path) -> None:
    # mkdtemp and the safetensors writer create private modes; servers may run as other users.
    out.chmod(0o755)
    for path in out.iterdir():
        path.chmod(0o644)


def _swap_in(tmp: Path, out: Path) -> None:
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)
