"""The evaluation supervisor: runs in the evaluation sandbox, started once per evaluation by the host
(stdlib only). Usage: POLAR_EVAL_KEY=<hex> python3 -I -B supervisor.py SPEC_JSON

Nothing from the agent's patch has run in the sandbox when it starts. It reads the key from its
environment, makes itself non-dumpable (so no process of the same uid can read its memory,
environment or file descriptors), reads the runner code and the task's test files once and checks
them against the host's hashes, then runs one child per test file (runner.py) with a private pipe
pair, a fresh ticket and a fresh nonce, and decides each outcome itself: a child that writes to the
channel before `ready`, exits without reporting, or leaves a process holding the channel is caught
here. The report goes to stdout as one line, `POLAR-REPORT <payload> <hmac>`, MACed with the key, so
the host can tell it from anything the code under test prints. Child output is only a log.
"""

import base64
import hashlib
import hmac
import json
import marshal
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time

BOOT = """
def _boot():
    import marshal, os, sys, types
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    def read(n):
        b = b""
        while len(b) < n:
            c = os.read(rfd, n - len(b))
            if not c:
                os._exit(3)
            b += c
        return b
    kit = marshal.loads(read(int.from_bytes(read(8), "big")))
    for name in ("polar_guard", "polar_runner"):
        m = types.ModuleType(name)
        m.__file__ = "<polar>/" + name + ".py"
        sys.modules[name] = m
        exec(compile(kit["sources"][name], m.__file__, "exec"), m.__dict__)
    sys.modules["polar_runner"].main(kit, rfd, wfd)
_boot()
"""
MAX_MESSAGE = 32 << 20
LOG_TAIL = 64 << 10
OUTLIVE_GRACE_S = 0.3


def make_undumpable():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False


def _read_verified(path, sha):
    with open(path, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != sha:
        raise SystemExit(f"polar supervisor: {path} does not match its hash")
    return data


class Channel:
    """The child's end of the result pipe, read with a deadline, one JSON line at a time."""

    def __init__(self, fd):
        self.fd, self.buf, self.eof = fd, b"", False

    def line(self, deadline):
        while b"\n" not in self.buf:
            if self.eof or len(self.buf) > MAX_MESSAGE or not self._fill(deadline):
                return None
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return {"garbage": line[:200].decode(errors="replace")}

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.fd], [], [], left)[0]:
            return False
        chunk = os.read(self.fd, 1 << 16)
        self.eof = not chunk
        self.buf += chunk
        return bool(chunk)

    def closed_within(self, seconds):
        """True when every writer has closed the pipe (nothing outlived the child)."""
        deadline = time.monotonic() + seconds
        while not self.eof:
            if not self._fill(deadline) and not self.eof:
                return False
        return not self.buf


def run_child(spec, kit, ids, python):
    """One test file in a fresh process; returns (results, tampering, fatal, log tail)."""
    kit = dict(kit, ids=ids)
    r_ctl, w_ctl = os.pipe()
    r_res, w_res = os.pipe()
    log = tempfile.TemporaryFile()
    child = subprocess.Popen(
        [python, "-I", "-B", "-c", BOOT, str(r_ctl), str(w_res)],
        pass_fds=(r_ctl, w_res),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(spec["env"], PATH=os.environ.get("PATH", "/usr/bin:/bin")),
    )
    os.close(r_ctl)
    os.close(w_res)
    ticket, nonce = secrets.token_hex(16), secrets.token_hex(16)
    channel = Channel(r_res)
    deadline = time.monotonic() + spec["startup_s"] + spec["timeout_s"] * len(ids)
    tampering: list[str] = []
    fatal, results, reported = None, {}, False
    try:
        blob = marshal.dumps(kit)
        os.write(w_ctl, len(blob).to_bytes(8, "big"))
        _write_all(w_ctl, blob)
        os.write(w_ctl, (ticket + "\n").encode())
        ready = channel.line(deadline)
        if ready == {"ready": ticket}:
            os.write(w_ctl, (nonce + "\n").encode())
            final = channel.line(time.monotonic() + 30)
            if isinstance(final, dict) and final.get("ticket") == ticket and final.get("nonce") == nonce:
                reported = True
                results = {k: v for k, v in final.get("results", {}).items() if k in ids}
                tampering += final.get("tampering") or []
                fatal = final.get("fatal")
            else:
                tampering.append("the result channel carried a message that is not the runner's")
        elif ready is not None:
            tampering.append("the code under test wrote to the result channel")
            _kill_group(child.pid)  # nothing it reports from now on counts
    except (BrokenPipeError, OSError) as exc:
        fatal = f"the test process stopped reading its control pipe: {exc}"
    code = _wait(child, deadline)
    if code is None:
        fatal = fatal or f"the test process exceeded {deadline - time.monotonic() + 0.0:.0f}s and was killed"
        results = {
            i: results.get(i, {"outcome": "timeout", "detail": "killed by the supervisor"}) for i in ids
        }
    elif not reported and not tampering:
        if code == 0:
            tampering.append("the test process exited with status 0 without reporting (sys.exit / os._exit)")
        else:
            fatal = fatal or f"the test process died (exit status {code}) before reporting"
    if not channel.closed_within(OUTLIVE_GRACE_S):
        tampering.append("a process started by the tests outlived them (it still holds the result channel)")
    _kill_group(child.pid)
    for fd in (w_ctl, r_res):
        _close(fd)
    return results, tampering, fatal, _tail(log)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _wait(child, deadline):
    try:
        return child.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(child.pid)
        child.wait()
        return None


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _close(fd):
    try:
        os.close(fd)
    except OSError:
        pass


def _tail(f):
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - LOG_TAIL))
    data = f.read().decode(errors="replace")
    f.close()
    return data


def restore_trusted(workspace, trusted):
    """Write the task's test files back as the host verified them (before every child)."""
    changed = []
    for rel, data in trusted.items():
        path = os.path.join(workspace, rel)
        try:
            with open(path, "rb") as f:
                same = f.read() == data
        except OSError:
            same = False
        if not same:
            changed.append(rel)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            if os.path.islink(path):
                os.unlink(path)
            with open(path, "wb") as f:
                f.write(data)
    return changed


def main():
    key = bytes.fromhex(os.environ.pop("POLAR_EVAL_KEY"))
    undumpable = make_undumpable()
    spec_path = sys.argv[1]
    with open(spec_path, "rb") as f:
        spec_bytes = f.read()
    spec = json.loads(spec_bytes)
    here = os.path.dirname(os.path.abspath(spec_path))
    sources = {
        name: _read_verified(os.path.join(here, f), sha).decode()
        for name, (f, sha) in spec["sources"].items()
    }
    trusted = {
        rel: _read_verified(os.path.join(spec["workspace"], rel), sha) for rel, sha in spec["trusted"].items()
    }
    bundle = (
        _read_verified(os.path.join(here, spec["bundle"][0]), spec["bundle"][1])
        if spec.get("bundle")
        else None
    )
    kit = {
        "sources": sources,
        "mode": spec["mode"],
        "trusted": trusted,
        "trusted_sha": spec["trusted"],
        "timeout": spec["timeout_s"],
        "pytest_args": spec.get("pytest_args", []),
        "bundle": bundle,
    }
    results, tampering, fatal, logs = {}, [], {}, []
    for ids in spec["files"]:
        rewritten = restore_trusted(spec["workspace"], trusted)
        if rewritten:
            tampering.append(f"test files changed between runs: {', '.join(rewritten[:5])}")
        got, bad, why, log = run_child(spec, kit, ids, sys.executable)
        results.update(got)
        tampering += [t for t in bad if t not in tampering]
        for test_id in ids:
            if why and test_id not in got:
                fatal[test_id] = why
        logs.append(log)
    payload = json.dumps(
        {
            "nonce": spec["nonce"],
            "spec_sha": hashlib.sha256(spec_bytes).hexdigest(),
            "results": results,
            "tampering": tampering,
            "fatal": fatal,
            "undumpable": undumpable,
            "log": "\n".join(logs)[-LOG_TAIL:],
        }
    ).encode()
    mac = hmac.new(key, payload, hashlib.sha256).hexdigest()
    sys.stdout.write(f"POLAR-REPORT {base64.b64encode(payload).decode()} {mac}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
