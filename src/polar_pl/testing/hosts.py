"""Test and bench kit for per-task images and remote hosts.

- `make_tls_certs(dir)`: a CA, a server certificate for 127.0.0.1 and a client certificate (openssl).
- `remote_dockerd(root, certs)`: a second dockerd listening on TCP 127.0.0.1 with mutual TLS.
- `LocalRegistry`: Debian's `docker-registry` (the distribution registry) on 127.0.0.1, with
  htpasswd credentials, and a Docker config.json that holds them (how the docker CLI stores a login).
- `make_wheel` / `dep_image_context`: a pure-Python wheel built here, and a Dockerfile FROM the
  offline base image that installs it: a per-task image with its own dependency, built offline.
- `debian_package(name)`: a .deb for a task Dockerfile to install offline, from the machine's apt
  cache, else fetched once with `apt-get download` into the sandbox cache (the Debian mirror is the
  one package source the base image comes from too).
- `TcpForwarder`: a TCP proxy whose `kill()` cuts every connection: a host that disappears.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import pytest

from polar_pl.utils.serving import free_port


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca: str
    server_cert: str
    server_key: str
    client_dir: str  # ca.pem, cert.pem, key.pem: what DOCKER_CERT_PATH / `cert_path` expects


def make_tls_certs(out: Path) -> TlsFiles:
    """Self-made CA plus server (SAN IP:127.0.0.1) and client certificates, 1 day, EC P-256."""
    out.mkdir(parents=True, exist_ok=True)
    client = out / "client"
    client.mkdir(exist_ok=True)

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=out, check=True, capture_output=True)

    def key(path: str) -> None:
        ssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", path)

    key("ca-key.pem")
    ssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca-key.pem",
        "-days",
        "1",
        "-subj",
        "/CN=polar-test-ca",
        "-out",
        "ca.pem",
    )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        key(f"{name}-key.pem")
        ssl("req", "-new", "-key", f"{name}-key.pem", "-subj", f"/CN={name}", "-out", f"{name}.csr")
        (out / f"{name}.ext").write_text(ext + "\n")
        ssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}-cert.pem",
        )
    shutil.copy(out / "ca.pem", client / "ca.pem")
    shutil.copy(out / "client-cert.pem", client / "cert.pem")
    shutil.copy(out / "client-key.pem", client / "key.pem")
    return TlsFiles(
        str(out / "ca.pem"), str(out / "server-cert.pem"), str(out / "server-key.pem"), str(client)
    )


def remote_dockerd(root: Path, certs: TlsFiles):
    """A DockerDaemon (not started) that also listens on tcp://127.0.0.1:<free port> with TLS."""
    from polar_pl.sandbox.dockerd import DockerDaemon

    tcp = f"127.0.0.1:{free_port()}"
    return DockerDaemon(root=root, tcp=tcp, tls=(certs.ca, certs.server_cert, certs.server_key))


class LocalRegistry:
    """docker-registry on 127.0.0.1:<port> with one htpasswd user; `docker_config` is a config.json
    that logs the engine in (`auths` with base64 user:password, as `docker login` writes it)."""

    def __init__(self, root: Path, user: str = "polar", password: str = "s3cret") -> None:
        self.root, self.user, self.password = root, user, password
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.docker_config = str(root / "docker-config" / "config.json")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> Self:
        with warnings.catch_warnings():  # deprecated (gone in 3.13): bcrypt without adding a package
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt

        binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
        if not Path(binary).exists():
            raise RuntimeError("docker-registry is not installed (apt-get install docker-registry)")
        self.root.mkdir(parents=True, exist_ok=True)
        # 2^4 bcrypt rounds: the registry checks the hash on every request of a pull
        hashed = crypt.crypt(self.password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
        (self.root / "htpasswd").write_text(f"{self.user}:{hashed}\n")
        config = {
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {
                "filesystem": {"rootdirectory": str(self.root / "data")},
                "delete": {"enabled": True},
            },
            "http": {"addr": self.address},
            "auth": {"htpasswd": {"realm": "polar-test", "path": str(self.root / "htpasswd")}},
        }
        (self.root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
        Path(self.docker_config).parent.mkdir(parents=True, exist_ok=True)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        Path(self.docker_config).write_text(json.dumps({"auths": {self.address: {"auth": token}}}))
        log = open(self.root / "registry.log", "ab")
        self.proc = subprocess.Popen(
            [binary, "serve", str(self.root / "config.yml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"docker-registry exited: {(self.root / 'registry.log').read_text()[-800:]}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("docker-registry did not come up")

    @property
    def auth(self) -> dict[str, str]:
        return {"username": self.user, "password": self.password}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def make_wheel(out: Path, name: str, version: str, source: str) -> Path:
    """A pure-Python wheel with one module `name` holding `source` (a real, pip-installable wheel)."""
    out.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: polar-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def debian_package(name: str) -> Path:
    """A .deb of `name` (for the host's Debian release, as the base image is): from
    /var/cache/apt/archives, else downloaded once into <sandbox cache>/debs."""
    from polar_pl.sandbox.image import cache_dir
    from polar_pl.utils.locks import file_lock

    found = sorted(Path("/var/cache/apt/archives").glob(f"{name}_*.deb"))
    if found:
        return found[-1]
    out = cache_dir() / "debs"
    out.mkdir(parents=True, exist_ok=True)
    with file_lock(out / name):
        if not (found := sorted(out.glob(f"{name}_*.deb"))):
            got = subprocess.run(
                ["apt-get", "download", name], check=False, cwd=out, capture_output=True, text=True
            )
            if got.returncode != 0 or not (found := sorted(out.glob(f"{name}_*.deb"))):
                raise RuntimeError(
                    f"no {name}.deb in the apt cache, and `apt-get download {name}` failed: {got.stderr}"
                )
    return found[-1]


def dep_image_context(out: Path, base: str, wheel: Path, extra: str = "") -> Path:
    """A build context: FROM `base`, the wheel unpacked into the system site-packages (the base
    image has no pip; a pure wheel is a zip of what pip would put there), a /app workspace. Build
    steps run as root; the sandbox hands /app to its user when it starts."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(wheel, out / wheel.name)
    (out / "Dockerfile").write_text(
        f"FROM {base}\nCOPY {wheel.name} /tmp/\n"
        f"RUN python3 -m zipfile -e /tmp/{wheel.name} /usr/lib/python3/dist-packages/ && rm /tmp/{wheel.name}\n"
        f"{extra}RUN mkdir -p /app\nWORKDIR /app\n"
    )
    return out


class TcpForwarder:
    """127.0.0.1:<port> -> target; `kill()` closes the listener and every connection at once."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_copy, args=(a, b), daemon=True).start()

    def kill(self) -> None:
        self.listener.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


# -- pytest fixtures (session scope: one remote engine, one registry, one image set per session) --


@dataclass(frozen=True, slots=True)
class RemoteEngine:
    url: str  # tcp://127.0.0.1:PORT (TLS)
    cert_path: str  # the client's ca.pem / cert.pem / key.pem
    daemon: object

    @property
    def host(self) -> dict[str, str]:
        """The `sandbox.docker_hosts` entry for this engine."""
        return {"url": self.url, "cert_path": self.cert_path}


@pytest.fixture(scope="session")
def remote_docker_engine(docker_engine, tmp_path_factory):
    """A second dockerd on TCP 127.0.0.1 with TLS certificates made for this session: the remote
    host. Its data root is fresh (nothing is shared with the local engine but the registry)."""
    from polar_pl.sandbox.dockerd import DockerUnavailable
    from polar_pl.sandbox.hosts import DockerHost, HostSpec
    from polar_pl.testing.sandbox import OWNER, leftovers

    tmp = tmp_path_factory.mktemp("remote-dockerd")
    certs = make_tls_certs(tmp / "certs")
    daemon = remote_dockerd(tmp / "root", certs)
    try:
        daemon.start()
    except DockerUnavailable as e:
        pytest.skip(f"no second Docker engine: {e}")
    engine = RemoteEngine(daemon.tcp_url, certs.client_dir, daemon)
    yield engine
    from polar_pl.sandbox.docker import sweep_docker

    client = DockerHost(HostSpec.of(engine.host)).client()
    left = leftovers(OWNER, client)
    sweep_docker(client, owner=None)  # also what sandboxes of a host that "disappeared" left there
    client.close()
    daemon.stop()
    assert not left, f"containers left behind: {left}"


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    if not (shutil.which("docker-registry") or Path("/usr/bin/docker-registry").exists()):
        pytest.skip("docker-registry is not installed (make docker-deps)")
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@dataclass(frozen=True, slots=True)
class DepImages:
    """Per-task images built in the test setup, each with its own wheel-installed module."""

    names: tuple[str, ...]  # image tags on the local engine
    modules: tuple[str, ...]  # the module each one can import
    contexts: tuple[str, ...]  # their build contexts


@pytest.fixture(scope="session")
def dep_images(docker_engine, docker_image, tmp_path_factory) -> Iterator[DepImages]:
    """Two images FROM the offline base image, each adding a dependency from a wheel built here."""
    import docker

    tmp = tmp_path_factory.mktemp("dep-images")
    client = docker.DockerClient(base_url=docker_engine.url, timeout=600)
    names, modules, contexts = [], [], []
    try:
        for tag in ("a", "b"):
            module = f"polar_dep_{tag}"
            wheel = make_wheel(tmp / "wheels", module, "1.0", f"VALUE = {tag!r}\n")
            ctx = dep_image_context(tmp / f"ctx-{tag}", docker_image, wheel)
            name = f"polar-test/dep-{tag}:{os.getpid()}"
            client.images.build(path=str(ctx), tag=name, network_mode="none", rm=True, forcerm=True)
            names.append(name)
            modules.append(module)
            contexts.append(str(ctx))
        yield DepImages(tuple(names), tuple(modules), tuple(contexts))
    finally:
        for name in names:
            try:
                client.images.remove(name, force=True)
            except docker.errors.ImageNotFound:
                pass
        client.close()
