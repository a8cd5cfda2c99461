"""User namespaces for bubblewrap run as root: the sandbox user must not be host root in disguise.

`bwrap --unshare-user --uid 1000` run by root maps the sandbox's uid 1000 to host uid 0. Without
capabilities that is still the *owner* of every root-owned inode it can reach: it could chmod the
host's /dev/null (bound into /dev), read root-only files in its view, make setuid-root files. So as
root we build the namespaces ourselves and hand them to bwrap (`--userns` / `--userns2`):

    ns1 (child of the host's):  0 -> host 0,  1000 -> host nobody    bwrap sets up mounts here, as
                                                                     root, so it can bind paths
                                                                     only root may traverse
    ns2 (child of ns1):         1000 -> ns1 1000 (= host nobody)     the command runs here, after
                                                                     `setpriv` drops to uid 1000
                                                                     and every capability

ns2 also gets `user.max_user_namespaces = 0`, so nothing inside can make a user namespace of its
own (what `bwrap --disable-userns` does, which cannot be combined with `--userns`). The pair is
made once per process by a short helper (this file run as a script: only a single-threaded process
may unshare its user namespace) and kept open as two file descriptors.

    python3 -I -S userns.py UID GID    (run by namespaces(); talks to its parent over stdin/stdout)
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

CLONE_NEWUSER = 0x10000000
SANDBOX_ID = 1000  # uid and gid inside the sandbox, as in the Docker image

_lock = threading.Lock()
_fds: tuple[int, int] | None = None


def namespaces(host_uid: int, host_gid: int) -> tuple[int, int]:
    """(ns1 fd, ns2 fd), made on first use; root only."""
    global _fds
    with _lock:
        if _fds is None:
            _fds = _make(host_uid, host_gid)
        return _fds


def _make(host_uid: int, host_gid: int) -> tuple[int, int]:
    helper = subprocess.Popen(
        [sys.executable, "-I", "-S", __file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _expect(helper, "ns1")
        _write_map(helper.pid, f"0 0 1\n{SANDBOX_ID} {host_uid} 1\n", f"0 0 1\n{SANDBOX_ID} {host_gid} 1\n")
        fd1 = os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        _send(helper, "go")
        inner = int(_expect(helper, "ns2"))
        fd2 = os.open(f"/proc/{inner}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        _send(helper, "done")
        helper.wait(10)
        return fd1, fd2
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()


def _expect(helper: subprocess.Popen, word: str) -> str:
    assert helper.stdout is not None and helper.stderr is not None  # _make opens all three pipes
    line = helper.stdout.readline().split()
    if not line or line[0] != word:
        helper.kill()
        raise RuntimeError(f"making the sandbox user namespaces failed: {helper.stderr.read().strip()}")
    return line[1] if len(line) > 1 else ""


def _send(helper: subprocess.Popen, word: str) -> None:
    assert helper.stdin is not None  # _make opens all three pipes
    helper.stdin.write(word + "\n")
    helper.stdin.flush()


def _write_map(pid: int, uid_map: str, gid_map: str) -> None:
    for name, text in (("uid_map", uid_map), ("gid_map", gid_map)):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(text)


# -- the helper process ----------------------------------------------------------------------------


def _unshare_user() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")


def _helper() -> None:
    """ns1 here; a forked child makes ns2 and caps it; this process (in ns1, the parent of ns2,
    with every capability there) writes ns2's maps, which the host's root may not do."""
    _unshare_user()
    print("ns1", flush=True)
    sys.stdin.readline()
    ready_r, ready_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(mapped_w)
        try:
            _unshare_user()
            os.write(ready_w, b"x")
            os.read(mapped_r, 1)
            with open("/proc/sys/user/max_user_namespaces", "w") as f:
                f.write("0\n")
            os.write(ready_w, b"x")
            os.read(mapped_r, 1)  # stay alive until the parent has opened ns2
        except BaseException as exc:
            print(f"ns2: {exc!r}", file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    os.close(ready_w)
    os.close(mapped_r)
    if os.read(ready_r, 1) != b"x":
        sys.exit("ns2: the child could not unshare its user namespace")
    _write_map(pid, f"{SANDBOX_ID} {SANDBOX_ID} 1\n", f"{SANDBOX_ID} {SANDBOX_ID} 1\n")
    os.write(mapped_w, b"x")
    if os.read(ready_r, 1) != b"x":
        sys.exit("ns2: the child could not cap user namespaces")
    print(f"ns2 {pid}", flush=True)
    sys.stdin.readline()
    os.write(mapped_w, b"x")
    os.waitpid(pid, 0)


if __name__ == "__main__":
    _helper()
