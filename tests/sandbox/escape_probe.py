"""The attacks of test_escape.py, run inside a sandbox as the agent would (stdlib only, any python3).

    python3 escape_probe.py PLAN_JSON   ->   one JSON object on stdout: probe name -> result

Each result says what happened, never just "failed": `ok` (the attack's system call succeeded),
`errno` (its name when it did not), and what was read (`found`: which secrets turned up). The host
side (test_escape.py) then checks the host itself: files unchanged, processes alive, nothing paused.
Nothing here writes to an existing host file: appends open and close without writing.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import sys
import urllib.error
import urllib.request

MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000


def _err(exc: OSError) -> dict:
    return {"ok": False, "errno": errno.errorcode.get(exc.errno or 0, str(exc.errno)), "detail": str(exc)}


def create(path: str) -> dict:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError as exc:
        return _err(exc)
    os.close(fd)
    return {"ok": True}


def open_for_append(path: str) -> dict:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        return _err(exc)
    os.close(fd)  # the permission is what is probed: nothing is written
    return {"ok": True}


def chmod(path: str, mode: int) -> dict:
    """chmod to the mode the file already has: allowed only to its owner (or on a writable mount)."""
    try:
        os.chmod(path, mode)
    except OSError as exc:
        return _err(exc)
    return {"ok": True}


def read(path: str, secrets: dict[str, str]) -> dict:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError as exc:
        return _err(exc) | {"found": []}
    return {"ok": True, "found": _found(data, secrets)}


def _found(data: bytes, secrets: dict[str, str]) -> list[str]:
    return sorted(name for name, value in secrets.items() if value.encode() in data)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    return libc


def mount_remount_rw(target: str) -> dict:
    """`mount -o remount,rw TARGET` as the mount(2) call it makes (a bind remount, then a plain one)."""
    libc = _libc()
    for flags in (MS_REMOUNT | MS_BIND, MS_REMOUNT):
        if libc.mount(None, target.encode(), None, flags, None) == 0:
            return {"ok": True}
    return {"ok": False, "errno": errno.errorcode.get(ctypes.get_errno(), "?")}


def nested_userns_remount(target: str, probe_file: str) -> dict:
    """A fresh user + mount namespace (full capabilities inside it), then remount TARGET rw and
    create a file there: what an agent does once `mount` alone is refused."""
    pid = os.fork()
    if pid == 0:
        libc = _libc()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            os._exit(100 + ctypes.get_errno())
        if libc.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND, None) != 0:
            os._exit(150 + ctypes.get_errno() % 50)
        res = create(probe_file)
        os._exit(0 if res["ok"] else 99)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return {"ok": True, "stage": "file created"}
    if code >= 150:
        return {"ok": False, "stage": "remount", "errno": errno.errorcode.get(code - 150, "?")}
    if code >= 100:
        return {"ok": False, "stage": "unshare", "errno": errno.errorcode.get(code - 100, "?")}
    return {"ok": False, "stage": "create", "errno": "EROFS/EACCES"}


def scan_proc(secrets: dict[str, str], host_pids: list[int]) -> dict:
    """Every /proc/<pid>/cmdline and environ readable from here, searched for the secrets."""
    found: set[str] = set()
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    found.update(_found(f.read(), secrets))
            except OSError:
                pass
    direct = {}
    for pid in host_pids:
        direct[str(pid)] = read(f"/proc/{pid}/cmdline", secrets)
    return {"ok": bool(found), "found": sorted(found), "pids_seen": len(pids), "direct": direct}


def scan_files(roots: list[str], skip: list[str], secrets: dict[str, str]) -> dict:
    """Every regular file under `roots` (outside `skip`, up to 4 MiB each) searched for the secrets."""
    found: dict[str, list[str]] = {}
    files = 0
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    if not os.path.isfile(path) or os.path.getsize(path) > 4 << 20:
                        continue
                    with open(path, "rb") as f:
                        hits = _found(f.read(), secrets)
                except OSError:
                    continue
                files += 1
                if hits:
                    found[path] = hits
    return {"ok": bool(found), "found": found, "files": files}


def connect(host: str, port: int) -> dict:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
    except TimeoutError:
        return {"ok": False, "errno": "ETIMEDOUT"}
    except OSError as exc:
        return _err(exc)
    finally:
        s.close()
    return {"ok": True}


def connect_unix(path: str) -> dict:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as exc:
        return _err(exc)
    finally:
        s.close()
    return {"ok": True}


def http(method: str, url: str, token: str | None, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    if token is not None:
        req.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return {"ok": True, "status": r.status, "body": r.read(2000).decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return {"ok": exc.code < 400, "status": exc.code, "body": exc.read(2000).decode(errors="replace")}
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        code = getattr(reason, "errno", None)
        return {"ok": False, "errno": errno.errorcode.get(code or 0, str(reason))}


def kill(pid: int) -> dict:
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError as exc:
        return _err(exc)
    return {"ok": True}


def identity() -> dict:
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    return {
        "ok": os.getuid() == 0 or int(status["CapEff"].strip(), 16) != 0,
        "uid": os.getuid(),
        "gid": os.getgid(),
        "cap_eff": status["CapEff"].strip(),
        "no_new_privs": status.get("NoNewPrivs", "?").strip(),
    }


def main(plan: dict) -> dict:
    s = plan["secrets"]
    nonce = plan["nonce"]
    out: dict[str, dict] = {"identity": identity()}
    for name, path in plan["create"].items():
        out[f"create:{name}"] = create(path)
    for name, path in plan["append"].items():
        out[f"append:{name}"] = open_for_append(path)
    for name, (path, mode) in plan["chmod"].items():
        out[f"chmod:{name}"] = chmod(path, mode)
    for name, path in plan["read"].items():
        out[f"read:{name}"] = read(path, s)
    for target in ("/", "/usr"):
        out[f"remount:{target}"] = mount_remount_rw(target)
    out["userns_remount:/usr"] = nested_userns_remount("/usr", f"/usr/polar-probe-{nonce}-ns")
    out["proc"] = scan_proc(s, plan["host_pids"])
    out["files"] = scan_files(plan["scan_roots"], plan["scan_skip"], s)
    for name, (host, port) in plan["connect"].items():
        out[f"connect:{name}"] = connect(host, port)
    for name, path in plan["unix"].items():
        out[f"unix:{name}"] = connect_unix(path)
    for name, (method, url, token, body) in plan["http"].items():
        out[f"http:{name}"] = http(method, url, token, body)
    for name, pid in plan["kill"].items():
        out[f"kill:{name}"] = kill(pid)
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        loaded = json.load(f)
    os.unlink(sys.argv[1])  # it names the secrets: the scan must not find them there
    print(json.dumps(main(loaded)))
