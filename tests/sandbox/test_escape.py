"""Escape probes: what an agent tries from inside its sandbox, on each isolating backend (bwrap,
docker), run as the test runner's user (root in CI). The attacks run in one process inside sandbox A
(escape_probe.py) while sandbox B, another rollout, holds its own session token; a real gateway
(trace store, admin routes) and engine run on the host, and a host process keeps secrets in its
command line and environment. Every test asserts the failure itself (the errno the call got, the
host file unchanged, the process alive, the secret absent), never an exit status alone.
`test_unsafe_local_stops_none_of_this` shows what `sandbox=unsafe_local` leaves open.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import httpx
import pytest
from fixture_paths import REPO

from polar_pl.gateway.handle import Gateway, SessionHandle
from polar_pl.testing.sandbox import OWNER
from polar_pl.testing.scripted import Reply, ScriptedServer, serve_scripted
from polar_pl.utils import tokens

PROBE = Path(__file__).with_name("escape_probe.py")
TASK = "calc-1"
BLOCKED = {"EROFS", "EACCES", "EPERM", "ENOENT"}


@dataclass
class World:
    engine: ScriptedServer
    gateway: Gateway
    store: Path
    a: SessionHandle
    b: SessionHandle
    helper: subprocess.Popen
    secrets: dict[str, str]


def _patch_line(name: str) -> str:
    """A line only the task's reference patch has (its first real added line)."""
    text = (resources.files("polar_pl.tasks.builtin") / "tasks" / TASK / name).read_text()
    added = (
        line[1:].strip() for line in text.splitlines() if line.startswith("+") and not line.startswith("+++")
    )
    return next(line for line in added if len(line) > 12)


@pytest.fixture(scope="module")
def world(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("escape")
    admin = tokens.admin_token(tmp / "traces.admin-token", create=True)  # where `polar-pl gateway` puts it
    marker = f"store-marker-{uuid.uuid4().hex}"
    with (
        serve_scripted(lambda chat: Reply("ok"), model_dir=tiny_model_dir) as engine,
        Gateway([engine.url], tmp / "traces.db", admin_token=admin, token_faithful=False) as gw,
    ):
        a = gw.create_session(task_id="escape-a")
        b = gw.create_session(task_id="escape-b")
        body = {"model": engine.model, "messages": [{"role": "user", "content": marker}], "max_tokens": 4}
        assert httpx.post(f"{b.base_url}/v1/chat/completions", json=body, timeout=60).status_code == 200
        cmd_secret, env_secret = f"cmdline-{uuid.uuid4().hex}", f"environ-{uuid.uuid4().hex}"
        helper = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(900)", cmd_secret],
            env=os.environ | {"POLAR_PROBE_SECRET": env_secret, "POLAR_ADMIN_TOKEN": admin},
        )
        found = {
            "admin_token": admin,
            "token_b": b.token,
            "host_cmdline": cmd_secret,
            "host_environ": env_secret,
            "fix_patch": _patch_line("fix.patch"),
            "test_patch": _patch_line("test.patch"),
            "store_record": marker,
        }
        try:
            yield World(engine, gw, tmp / "traces.db", a, b, helper, found)
        finally:
            helper.kill()
            helper.wait()


def _make(kind: str, request):
    from polar_pl.sandbox.local import LocalSandbox

    if kind == "docker":
        from polar_pl.sandbox.docker import DockerSandbox

        engine = request.getfixturevalue("docker_engine")
        image = request.getfixturevalue("docker_image")
        return DockerSandbox(image=image, docker_host=engine.url, owner=OWNER)
    return LocalSandbox(isolation="bwrap" if kind == "bwrap" else "none", owner=OWNER)


def _host_ip() -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        return s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()


def _relay_socket(sb, port: int) -> str:
    """The host path of the unix socket a sandbox's gateway relay listens on."""
    run_dir = getattr(sb, "_run_dir", None) or sb.root / "run"
    path = Path(run_dir) / f"gw-{port}.sock"
    assert path.exists(), path
    return str(path)


def _plan(w: World, a, b, url: str, *, destructive: bool = True) -> dict:
    nonce = uuid.uuid4().hex[:12]
    pkg = Path(str(resources.files("polar_pl.tasks.builtin"))) / "tasks" / TASK
    checkout = REPO / "src" / "polar_pl" / "tasks" / "builtin" / "tasks" / TASK
    engine_port = int(w.engine.url.rsplit(":", 1)[1])
    creates = {
        "usr": f"/usr/polar-probe-{nonce}",
        "etc": f"/etc/polar-probe-{nonce}",
        "checkout": f"{REPO}/polar-probe-{nonce}",
        "package": f"{pkg}/polar-probe-{nonce}",
        "other_workspace": f"{b.workdir}/polar-probe-{nonce}",
        "other_home": f"{b.home}/polar-probe-{nonce}",
        "store_dir": f"{w.store.parent}/polar-probe-{nonce}",
        "agent_packages": f"/opt/polar/py/polar-probe-{nonce}",
        "python_stdlib": f"{os.path.dirname(os.__file__)}/polar-probe-{nonce}.py",
    }
    if a.harness_prefix:
        creates["harness_prefix"] = f"{a.harness_prefix}/polar-probe-{nonce}"
    appends = {
        "usr": "/usr/lib/os-release",
        "etc_passwd": "/etc/passwd",
        "etc_hosts": "/etc/hosts",
        "checkout": f"{REPO}/pyproject.toml",
        "fix_patch": str(pkg / "fix.patch"),
        "core_pattern": "/proc/sys/kernel/core_pattern",
        "sysrq": "/proc/sysrq-trigger",
        "cgroup_procs": "/sys/fs/cgroup/cgroup.procs",
        **{f"disk_{d}": f"/dev/{d}" for d in os.listdir("/sys/block") if not d.startswith(("loop", "ram"))},
    }
    reads = {
        "shadow": "/etc/shadow",
        "fix_patch_package": str(pkg / "fix.patch"),
        "test_patch_package": str(pkg / "test.patch"),
        "fix_patch_checkout": str(checkout / "fix.patch"),
        "test_patch_checkout": str(checkout / "test.patch"),
        "store": str(w.store),
        "store_wal": f"{w.store}-wal",
        "admin_token_file": f"{w.store.parent}/traces.admin-token",
        "other_home_token": f"{b.home}/.polar/token",
        "host_environ": f"/proc/{w.helper.pid}/environ",
    }
    skip = ["/proc", "/sys", "/dev", "/usr", "/opt/polar/harness", sys.base_prefix, a.harness_prefix or "/-"]
    connect = {
        "engine": ["127.0.0.1", engine_port],
        "engine_ipv6": ["::1", engine_port],
        "internet": ["1.1.1.1", 443],
    }
    if ip := _host_ip():
        connect |= {"host_ip_engine": [ip, engine_port], "host_ip_gateway": [ip, w.gateway.port]}
    unix = {"docker_default": "/var/run/docker.sock"}
    if destructive:  # unsafe_local has no relay: it is on the host network
        unix["other_sandbox_relay"] = _relay_socket(b, w.gateway.port)
    unix |= {f"dockerd_{i}": str(p) for i, p in enumerate(Path("/run").glob("polar-dockerd-*/docker.sock"))}
    tok_a = w.a.token
    http = {
        "admin_list_no_token": ["GET", f"{url}/admin/sessions", None, None],
        "admin_list_session_token": ["GET", f"{url}/admin/sessions", tok_a, None],
        "admin_records_of_b": ["GET", f"{url}/admin/sessions/{w.b.session_id}/records", tok_a, None],
        "admin_pause": ["POST", f"{url}/admin/pause", tok_a, {}],
        "admin_new_session_guess": ["POST", f"{url}/admin/sessions", "polar", {"task_id": "forged"}],
        "engine_weights_via_gateway": ["POST", f"{url}/update_weights_from_disk", tok_a, {"path": "/tmp"}],
        "engine_weights_via_session": [
            "POST",
            f"{url}/s/{tok_a}/update_weights_from_disk",
            tok_a,
            {"path": "/"},
        ],
    }
    return {
        "nonce": nonce,
        "secrets": w.secrets,
        "create": creates if destructive else {},  # unsafe_local: these would land on the host
        "append": appends if destructive else {},
        "chmod": {"dev_null": ["/dev/null", 0o666], "usr_env": ["/usr/bin/env", 0o755]}
        if destructive
        else {},
        "read": reads,
        "host_pids": [w.helper.pid, os.getpid()],
        "scan_roots": ["/"] if destructive else [],  # unsafe_local: that would be the whole host
        "scan_skip": skip,
        "connect": connect,
        "unix": unix,
        "http": http,
        "kill": {"host_helper": w.helper.pid, "test_runner": os.getpid()} if destructive else {},
    }


def _probe(w: World, a, b, *, destructive: bool = True) -> dict:
    """Run the attacks in A while B runs a harness holding its token (env and a config file)."""
    b.put_file(f"{b.home}/.polar/token", w.b.token.encode(), mode=0o600)
    b.expose_gateway(w.gateway.url)
    holder = threading.Thread(target=_hold, args=(b, w.b.token), daemon=True)
    holder.start()
    url = a.expose_gateway(w.gateway.url)
    plan = _plan(w, a, b, url, destructive=destructive)
    a.put_file(f"{a.home}/probe.py", PROBE.read_bytes())
    a.put_file(f"{a.home}/plan.json", json.dumps(plan).encode())
    env = {"OPENAI_API_KEY": w.a.token, "OPENAI_BASE_URL": f"{url}/s/{w.a.token}/v1"}
    res = a.exec(["python3", f"{a.home}/probe.py", f"{a.home}/plan.json"], env=env, timeout=300)
    assert res.exit_code == 0, res.stderr[-3000:]
    return {"results": json.loads(res.stdout), "plan": plan}


def _hold(b, token: str) -> None:
    with contextlib.suppress(Exception):  # the sandbox is stopped under it at the end of the module
        b.exec(["sleep", "600"], env={"OPENAI_API_KEY": token}, timeout=600)


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def probed(request, world):
    a, b = _make(request.param, request), _make(request.param, request)
    dev_null = os.stat("/dev/null")
    try:
        a.start()
        b.start()
        out = _probe(world, a, b)
        yield out | {"kind": request.param, "a": a, "b": b, "world": world}
    finally:
        for sb in (a, b):
            sb.stop()
        if os.stat("/dev/null").st_mode != dev_null.st_mode:  # an escape must not break the host
            os.chmod("/dev/null", 0o666)


def _blocked(result: dict) -> bool:
    return result["ok"] is False and result.get("errno") in BLOCKED


# -- who the agent is --------------------------------------------------------------------------


def test_unprivileged_user_without_capabilities(probed):
    me = probed["results"]["identity"]
    assert (me["uid"], me["gid"], me["cap_eff"], me["no_new_privs"]) == (1000, 1000, "0000000000000000", "1")


# -- writes --------------------------------------------------------------------------------------


def test_cannot_create_files_outside_its_workspace(probed):
    """/usr, /etc, the checkout, the installed package, another sandbox's workspace and home, the
    store's folder, the agent's packages, the interpreter's stdlib, the harness prefix."""
    plan, results, a, b = probed["plan"], probed["results"], probed["a"], probed["b"]
    for name, path in plan["create"].items():
        if os.path.dirname(path) in (a.workdir, a.home):
            continue  # docker: B's workspace is at the same path as A's own; B is checked below
        assert _blocked(results[f"create:{name}"]), (name, results[f"create:{name}"])
        assert not Path(path).exists(), f"{name}: {path} was created on the host"
    assert "polar-probe" not in b.exec(["ls", "-A", b.workdir, b.home]).stdout


def test_cannot_open_host_files_for_writing(probed):
    """Existing files (opened for append, nothing written): system files, the checkout, the task's
    reference patch, the kernel's core_pattern and sysrq trigger, the cgroup tree, raw disks."""
    results = probed["results"]
    for name in probed["plan"]["append"]:
        assert _blocked(results[f"append:{name}"]), (name, results[f"append:{name}"])


def test_cannot_chmod_host_inodes(probed):
    """Found on bwrap --unshare-user run by root: the sandbox's uid maps to host root, the owner of
    /dev/null (bound in from the host), and `chmod` changed the host's /dev/null."""
    results = probed["results"]
    for name in probed["plan"]["chmod"]:
        assert _blocked(results[f"chmod:{name}"]), (name, results[f"chmod:{name}"])
    assert os.stat("/dev/null").st_mode & 0o777 == 0o666


def test_cannot_remount_read_only_mounts(probed):
    results, nonce = probed["results"], probed["plan"]["nonce"]
    for target in ("/", "/usr"):
        assert results[f"remount:{target}"] == {"ok": False, "errno": "EPERM"}, results[f"remount:{target}"]
    nested = results["userns_remount:/usr"]
    assert nested["ok"] is False and nested["errno"] in {"ENOSPC", "EPERM"}, nested
    assert not Path(f"/usr/polar-probe-{nonce}-ns").exists()


# -- reads ---------------------------------------------------------------------------------------


def test_cannot_read_secrets(probed):
    """Reference patches (package and checkout), the trace store, /etc/shadow, another session's
    token file, a host process's environment: every read fails and no secret turns up."""
    results = probed["results"]
    for name in probed["plan"]["read"]:
        got = results[f"read:{name}"]
        assert _blocked(got) and got["found"] == [], (name, got)


def test_no_view_of_host_processes(probed):
    """/proc/*/cmdline and environ of everything visible: none of the host's secrets (admin token in
    the environment, secrets on a command line) nor the other sandbox's token."""
    proc = probed["results"]["proc"]
    assert proc["found"] == [], proc
    assert proc["pids_seen"] < 20, proc  # only the sandbox's own processes
    for pid, got in proc["direct"].items():  # a pid inside is another process than the host's
        assert got["found"] == [], (pid, got)


def test_no_secret_anywhere_in_its_filesystem(probed):
    files = probed["results"]["files"]
    assert files["found"] == {} and files["files"] > 0, files


# -- network and processes -------------------------------------------------------------------------


def test_reaches_no_address_but_the_gateway(probed):
    """The engine (v4, v6, the host's own address), the internet, the gateway at the host's address:
    all refused or unreachable from inside; only the relayed gateway port answers."""
    results = probed["results"]
    for name in probed["plan"]["connect"]:
        got = results[f"connect:{name}"]
        assert got["ok"] is False and got["errno"] in {"ECONNREFUSED", "ENETUNREACH", "EADDRNOTAVAIL"}, (
            name,
            got,
        )
    assert probed["world"].engine.backend.policy_version == 0  # no weight update arrived


def test_no_unix_socket_of_the_host(probed):
    """The Docker engine's sockets (root on the host) and the other sandbox's gateway relay."""
    results = probed["results"]
    for name in probed["plan"]["unix"]:
        assert _blocked(results[f"unix:{name}"]), (name, results[f"unix:{name}"])


def test_gateway_admin_routes_refuse_the_agent(probed):
    """Through the gateway it may reach: admin routes refuse a missing, guessed or session token,
    and the engine's weight-update route is not reachable through it."""
    results, w = probed["results"], probed["world"]
    for name in probed["plan"]["http"]:
        got = results[f"http:{name}"]
        assert got.get("status") in {401, 403, 404, 405}, (name, got)
    assert not w.gateway.paused
    auth = {"authorization": f"Bearer {w.gateway.admin_token}"}
    listed = httpx.get(f"{w.gateway.url}/admin/sessions", headers=auth, timeout=30).json()
    assert "forged" not in json.dumps(listed)


def test_cannot_signal_host_processes(probed):
    results, w = probed["results"], probed["world"]
    for name in probed["plan"]["kill"]:
        assert results[f"kill:{name}"]["errno"] == "ESRCH", (name, results[f"kill:{name}"])
    assert w.helper.poll() is None


# -- what unsafe_local does not stop ---------------------------------------------------------------


def test_unsafe_local_stops_none_of_this(world):
    """`sandbox=unsafe_local` warns, and the agent reads the reference patch, sees host processes'
    secrets and reaches the engine (read-only attacks only: its writes would land on the host)."""
    from polar_pl.sandbox.local import UnsafeSandboxWarning

    with pytest.warns(UnsafeSandboxWarning, match="isolation is off"):
        a, b = _make("unsafe_local", None), _make("unsafe_local", None)
    a.start()
    b.start()
    try:
        results = _probe(world, a, b, destructive=False)["results"]
    finally:
        a.stop()
        b.stop()
    assert results["read:fix_patch_package"]["found"] == ["fix_patch"]
    assert {"admin_token", "host_cmdline", "host_environ"} <= set(results["proc"]["found"])
    assert results["connect:engine"]["ok"] is True
