"""What a container on a remote Docker host gets instead of bind mounts: a tools volume and the
gateway relayed over a `docker exec` stream (see hosts.py for which hosts are remote).

Tools volume: the relay script, the mini agent's Python packages, the harness CLIs and Node are
packed once per host into a named volume (`polar-tools-<fingerprint>`), mounted read-only at
/opt/polar/tools in every container there. The fingerprint covers the host paths, sizes and
modification times, so changed tools get a new volume; `polar-pl sandbox gc` removes old ones.
"""

from __future__ import annotations

import hashlib
import socket
import tarfile
import tempfile
import uuid
from pathlib import Path

from polar_pl.sandbox.relay import MuxRelay

TOOLS_IN = "/opt/polar/tools"
TOOLS_LABEL = "polar_pl.tools"
RELAY = Path(__file__).with_name("relay.py")


def tool_paths(pydeps: str | None, prefix: str | None, node: str | None) -> dict[str, str]:
    """{name inside the volume: host path} for the tools a container needs."""
    tools = {"relay.py": str(RELAY)}
    if pydeps:
        tools["py"] = pydeps
    if prefix:
        tools["harness"] = prefix
    if node:
        tools["bin/node"] = str(Path(node).resolve())
    return tools


def fingerprint(tools: dict[str, str]) -> str:
    h = hashlib.sha1()
    for name, path in sorted(tools.items()):
        p = Path(path)
        stat = p.stat()
        h.update(f"{name}\0{p.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        if p.is_dir():  # a re-installed folder: its marker or its top entries change
            for child in sorted(p.iterdir())[:200]:
                h.update(f"{child.name}\0{child.stat().st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def ensure_tools_volume(host, client, image: str, tools: dict[str, str]) -> str:
    """The host's tools volume for `tools`, created and filled (through a stopped helper container
    from `image`) the first time; returns its name."""
    import docker
    from docker.types import Mount

    fp = fingerprint(tools)
    name = f"polar-tools-{fp}"
    with host.lock:
        if host.tools.get(fp):
            return name
        try:
            client.volumes.get(name)
            host.tools[fp] = name
            return name
        except docker.errors.NotFound:
            pass
        client.volumes.create(name, labels={TOOLS_LABEL: "1"})
        helper = None
        try:
            helper = client.containers.create(
                image,
                command=["true"],
                mounts=[Mount(TOOLS_IN, name, type="volume")],
                labels={TOOLS_LABEL: "1"},
                name=f"polar-tools-fill-{uuid.uuid4().hex[:8]}",
            )
            with tempfile.TemporaryFile() as buf:
                with tarfile.open(fileobj=buf, mode="w") as tar:
                    for inside, path in tools.items():
                        tar.add(path, arcname=inside, filter=_readable)
                buf.seek(0)
                client.api.put_archive(helper.id, TOOLS_IN, buf)
        except BaseException:
            client.volumes.get(name).remove(force=True)
            raise
        finally:
            if helper is not None:
                helper.remove(force=True)
        host.tools[fp] = name
        return name


def use_tools_volume(sandbox, host, config: dict, env: dict[str, str]) -> list:
    """Mounts for a container of `sandbox` on the remote `host`: its tools volume. Points the
    sandbox's harness prefix, Python path and relay at the volume and puts Node on PATH (in env)."""
    from docker.types import Mount

    tools = tool_paths(sandbox.host_pydeps, sandbox.host_prefix, sandbox.node)
    volume = ensure_tools_volume(host, sandbox.client, sandbox.image, tools)
    t = TOOLS_IN
    sandbox.harness_prefix = f"{t}/harness" if sandbox.host_prefix else None
    sandbox.python = ["env", f"PYTHONPATH={t}/py", "python3"] if sandbox.host_pydeps else ["python3"]
    sandbox.relay_in = f"{t}/relay.py"
    env["PATH"] = f"{t}/bin:" + (
        _image_path(config) or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    )
    return [Mount(TOOLS_IN, volume, type="volume", read_only=True)]


def _image_path(config: dict) -> str | None:
    for item in config.get("Env") or ():
        if item.startswith("PATH="):
            return item[5:]
    return None


def _readable(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode |= 0o444 | (0o111 if info.isdir() or info.mode & 0o100 else 0)
    return info


def start_mux_relay(api, container_id: str, port: int, gw_host: str, gw_port: int, user: str) -> MuxRelay:
    """Run `relay.py mux 127.0.0.1:<port>` in the container, attached; bridge it to the gateway."""
    argv = ["python3", "-I", "-S", f"{TOOLS_IN}/relay.py", "mux", f"127.0.0.1:{port}"]
    exec_id = api.exec_create(
        container_id, argv, stdin=True, stdout=True, stderr=False, tty=False, user=user
    )["Id"]
    sock = api.exec_start(exec_id, socket=True)
    # a relay is idle between model calls for as long as the harness thinks: no read timeout
    for s in (sock, getattr(sock, "_sock", None)):
        if s is not None and hasattr(s, "settimeout"):
            s.settimeout(None)
    return MuxRelay(sock, lambda: socket.create_connection((gw_host, gw_port), timeout=None)).start()
