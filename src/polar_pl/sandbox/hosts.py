"""Docker hosts: where containers run, how many each takes, and whether each is alive.

`sandbox.docker_hosts` lists engines: a unix socket on this machine (`unix:///run/docker.sock`),
`tcp://HOST:PORT` with TLS (`tls: {ca_cert, client_cert, client_key}` or `cert_path: DIR` holding
ca.pem / cert.pem / key.pem, as DOCKER_CERT_PATH does), or `ssh://user@host` (through the `ssh`
binary and its config). Each entry is a URL or a mapping with `url`, `capacity` (containers at
once; null = unbounded) and the TLS keys. `HostPool.acquire` places a sandbox on the healthy host
with the lowest load (active / capacity), waiting while every host is full; a host whose engine
stops answering is marked down at once and probed again every `health_interval_s`.

Only a unix-socket host is *local*: it shares this machine's filesystem, so containers there get
the host's tool folders and the gateway socket bind-mounted. A TCP or SSH host is remote even when
it is 127.0.0.1 (the engine may be another machine's): its containers get the tools from a volume
filled once per host, and the gateway through a relay multiplexed over a `docker exec` stream.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_pl.sandbox.images import ImageCache
from polar_pl.sandbox.infra import InfraError, RetryPolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HostSpec:
    url: str
    capacity: int | None = None
    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    @classmethod
    def of(cls, entry: str | Mapping[str, Any] | HostSpec) -> HostSpec:
        if isinstance(entry, HostSpec):
            return entry
        if isinstance(entry, str):
            entry = {"url": entry}
            if entry["url"].startswith("tcp://") and os.environ.get("DOCKER_CERT_PATH"):
                entry["cert_path"] = os.environ["DOCKER_CERT_PATH"]  # as the docker CLI reads it
        entry = dict(entry)
        url = entry.pop("url", None)
        if not isinstance(url, str) or not url.startswith(("unix://", "tcp://", "ssh://", "http")):
            raise ValueError(f"sandbox.docker_hosts: {url!r} is not a unix://, tcp:// or ssh:// URL")
        tls = dict(entry.pop("tls", None) or {})
        if cert_path := entry.pop("cert_path", None):
            d = Path(cert_path)
            tls = {
                "ca_cert": str(d / "ca.pem"),
                "client_cert": str(d / "cert.pem"),
                "client_key": str(d / "key.pem"),
            } | tls
        capacity = entry.pop("capacity", None)
        if entry or set(tls) - {"ca_cert", "client_cert", "client_key"}:
            unknown = sorted(set(entry) | (set(tls) - {"ca_cert", "client_cert", "client_key"}))
            raise ValueError(
                f"sandbox.docker_hosts[{url}]: unknown keys {unknown}; allowed: url, "
                "capacity, cert_path, tls.ca_cert, tls.client_cert, tls.client_key"
            )
        if capacity is not None and int(capacity) < 1:
            raise ValueError(f"sandbox.docker_hosts[{url}].capacity={capacity}: must be at least 1")
        return cls(url, None if capacity is None else int(capacity), **tls)

    @property
    def local(self) -> bool:
        return self.url.startswith("unix://")


class DockerHost:
    """One engine: its clients, its image cache, its load and its health."""

    def __init__(self, spec: HostSpec, images: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.url = spec.url
        self.local = spec.local
        self.capacity = spec.capacity
        self.active = 0
        self.healthy = True
        self.checked = 0.0
        self.failures = 0
        self.images = ImageCache(self.client, **(images or {}))
        self.lock = threading.Lock()  # guards one-time per-host setup (tools volume)
        self.tools: dict[str, str] = {}  # fingerprint -> volume name, filled once

    def client(self, timeout: float = 300):
        import docker

        tls = None
        if self.spec.client_cert or self.spec.ca_cert:
            cert = (self.spec.client_cert, self.spec.client_key) if self.spec.client_cert else None
            tls = docker.tls.TLSConfig(
                client_cert=cert, ca_cert=self.spec.ca_cert, verify=bool(self.spec.ca_cert)
            )
        url = self.url.replace("tcp://", "https://", 1) if tls and self.url.startswith("tcp://") else self.url
        cls = _TlsClient if tls else docker.DockerClient
        return cls(base_url=url, tls=tls, timeout=timeout, use_ssh_client=self.url.startswith("ssh://"))

    def ping(self, timeout: float = 5.0) -> bool:
        try:
            client = self.client(timeout=timeout)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    @property
    def load(self) -> float:
        return self.active / self.capacity if self.capacity else self.active / 1e6

    def __repr__(self) -> str:
        return f"DockerHost({self.url}, active={self.active}, healthy={self.healthy})"


def _tls_api():
    import docker

    class TlsAPI(docker.APIClient):
        """requests lets $REQUESTS_CA_BUNDLE override a session's CA whenever a request does not name
        one; the engine's own CA must win, or no self-signed engine certificate ever verifies."""

        def merge_environment_settings(self, url, proxies, stream, verify, cert):
            return super().merge_environment_settings(
                url, proxies, stream, self.verify if verify is None else verify, cert
            )

    return TlsAPI


def _TlsClient(**kwargs):
    import docker

    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = _tls_api()(**kwargs)
    return client


class HostPool:
    """Least-loaded placement over healthy hosts with per-host capacity."""

    def __init__(
        self,
        hosts: Sequence[str | Mapping[str, Any] | HostSpec],
        *,
        images: dict[str, Any] | None = None,
        health_interval_s: float = 5.0,
        acquire_timeout_s: float = 600.0,
    ) -> None:
        if not hosts:
            raise ValueError("sandbox.docker_hosts is empty: give at least one engine URL")
        self.hosts = [DockerHost(HostSpec.of(h), images) for h in hosts]
        self.health_interval_s = health_interval_s
        self.acquire_timeout_s = acquire_timeout_s
        self._cond = threading.Condition()

    def _probe(self, now: float) -> None:
        """Ping the hosts due for a check. Called holding the pool's lock; the pings run without it,
        so that a host that does not answer stalls no other placement for its ping timeout."""
        due = [h for h in self.hosts if now - h.checked >= self.health_interval_s]
        for h in due:
            h.checked = now
        if not due:
            return
        self._cond.release()
        try:
            answers = {h: h.ping() for h in due}
        finally:
            self._cond.acquire()
        for h, up in answers.items():
            if h.healthy != up:
                log.warning("docker host %s is %s", h.url, "up again" if up else "down")
            h.healthy = up

    def acquire(self, exclude: Sequence[DockerHost] = ()) -> DockerHost:
        """A healthy host with room (least loaded first); blocks while all are full.
        Raises InfraError("host") when no host is healthy."""
        deadline = time.monotonic() + self.acquire_timeout_s
        with self._cond:
            while True:
                self._probe(time.monotonic())
                up = [h for h in self.hosts if h.healthy]
                if not up:
                    raise InfraError(
                        "host", "no healthy docker host: " + ", ".join(h.url for h in self.hosts)
                    )
                candidates = [h for h in up if h not in exclude] or up
                free = [h for h in candidates if h.capacity is None or h.active < h.capacity]
                if free:
                    host = min(free, key=lambda h: (h.load, self.hosts.index(h)))
                    host.active += 1
                    return host
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InfraError(
                        "host", f"every docker host is at capacity after {self.acquire_timeout_s:.0f}s"
                    )
                self._cond.wait(min(left, self.health_interval_s))

    def release(self, host: DockerHost) -> None:
        with self._cond:
            host.active = max(0, host.active - 1)
            self._cond.notify_all()

    def mark_failed(self, host: DockerHost, exc: BaseException) -> None:
        """An operation on `host` failed for infrastructure reasons: probe it now."""
        with self._cond:
            host.failures += 1
            host.checked = 0.0
            self._probe(time.monotonic())
            self._cond.notify_all()

    def healthy(self) -> list[DockerHost]:
        with self._cond:
            self._probe(time.monotonic())
            return [h for h in self.hosts if h.healthy]

    def close(self) -> None:
        for h in self.hosts:
            h.images.close()


def images_options(
    registry: str | None,
    docker_config: str | None,
    max_pulls: int,
    retries: RetryPolicy,
    build_timeout_s: float,
) -> dict[str, Any]:
    return {
        "registry": registry,
        "docker_config": docker_config,
        "max_pulls": max_pulls,
        "retries": retries,
        "build_timeout_s": build_timeout_s,
    }
