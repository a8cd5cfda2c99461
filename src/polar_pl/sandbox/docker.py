"""The Docker backend: one container per sandbox, through the docker SDK against a real engine.

Isolation: `network_mode="none"` (only loopback), all capabilities dropped, no-new-privileges,
an unprivileged user (uid 1000), memory (no extra swap) / pids / CPU limits. The gateway is reached
through a unix socket bind-mounted from the host (see relay.py): inside, a relay listens on the
gateway's own `127.0.0.1:<port>`, so the harness uses the URL it was given. Node, the harness CLIs
and the mini agent's Python packages are mounted read-only from the host. Every container carries
labels so that `polar-pl sandbox cleanup` (and the start of a sweep) removes leftovers after a crash.

Hosts and images: the container is placed on a host of a `HostPool` (hosts.py; one local engine by
default) and starts from the task's image, made present there by the host's `ImageCache`
(images.py). On a remote host the tools come from a volume and the gateway through an exec-stream
relay (docker_remote.py). Per-task images keep their own WORKDIR as the workspace (SWE-bench's
/testbed); one that is not the sandbox user's is handed to it at start (the only root exec, with
CAP_CHOWN kept in the bounding set: processes of uid 1000 under no-new-privileges never get it).

Failures of the engine (start, exec, copy) are retried with backoff (`retries`); what still fails
raises `InfraError` (infra.py). An exec is retried only when it provably never started.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Self

from polar_pl.sandbox import creator, docker_remote, gitdiff
from polar_pl.sandbox.docker_files import ContainerFiles
from polar_pl.sandbox.hosts import DockerHost, HostPool
from polar_pl.sandbox.image import DEFAULT_TAG, USER_UID, cache_dir, mounted_harness_prefix
from polar_pl.sandbox.infra import InfraError, RetryPolicy, transient, with_retries
from polar_pl.sandbox.local import parse_bytes
from polar_pl.sandbox.protocol import ExecResult
from polar_pl.sandbox.relay import MuxRelay, Relay, inside_url, unix_to_tcp

log = logging.getLogger(__name__)
LABEL = "polar_pl.sandbox"
OWNER_LABEL = "polar_pl.owner"
CREATOR_LABEL = "polar_pl.creator"  # host/pid-start: a sweep leaves a live run's containers alone
RUN_PREFIX = "polar-dk-"
PREFIX_IN = "/opt/polar/harness"
PYDEPS_IN = "/opt/polar/py"
RELAY_IN = "/opt/polar/relay.py"
RUN_IN = "/opt/polar/run"
GIT_DIR_IN = "/tmp/.polar-baseline.git"


def client_for(docker_host: str | None, timeout: float = 300):
    import docker

    if docker_host:
        return docker.DockerClient(base_url=docker_host, timeout=timeout)
    return docker.from_env(timeout=timeout)


def default_host() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


# Exec output is streamed on its own connection whose read timeout must outlast the longest silent
# stretch of a harness; the exec itself is bounded inside the container by `timeout`.
EXEC_READ_TIMEOUT = 7 * 24 * 3600


class DockerSandbox(ContainerFiles):
    """`Sandbox` in a container. `workdir` is /workspace, `home` /home/polar, inside the container."""

    def __init__(
        self,
        image: str = DEFAULT_TAG,
        docker_host: str | None = None,
        *,
        pool: HostPool | None = None,
        image_context: str | None = None,
        owned_paths: tuple[str, ...] = (),
        retries: RetryPolicy | dict | int | None = None,
        memory: str | int | None = "4g",
        pids: int | None = 512,
        cpus: float | None = 2.0,
        owner: str = "default",
        harness_prefix: str | None = None,
        node: str | None = None,
        pydeps: str | None = None,
        default_timeout: float | None = None,
    ) -> None:
        self.image = image or DEFAULT_TAG
        self.image_context = image_context
        self.owned_paths = tuple(owned_paths)  # created and handed to the sandbox user at start
        self.retries = RetryPolicy.of(retries)
        self._own_pool = pool is None
        self.pool = pool or HostPool([docker_host or default_host()], images={"retries": self.retries})
        self.host: DockerHost | None = None
        self.docker_host = docker_host
        self.memory = parse_bytes(memory)
        self.pids = pids
        self.cpus = cpus
        self.owner = owner
        # What is mounted from the host exists, or is left out: Docker refuses a missing bind source
        # and every container create would fail. "" = no harness CLIs (the mini agent needs none);
        # None = the default prefix.
        self.host_prefix = None if harness_prefix == "" else mounted_harness_prefix(harness_prefix)
        node = shutil.which("node") if node is None else node  # "" = no Node
        self.node = node if node and os.path.exists(node) else None
        deps = Path(pydeps) if pydeps else cache_dir() / "pydeps"
        self.host_pydeps = str(deps) if (deps / ".complete").exists() or (pydeps and deps.is_dir()) else None
        self.default_timeout = default_timeout
        self.workdir = "/workspace"
        self.home = "/home/polar"
        self.harness_prefix = PREFIX_IN if self.host_prefix else None
        self.python = ["env", f"PYTHONPATH={PYDEPS_IN}", "python3"] if self.host_pydeps else ["python3"]
        self.relay_in = RELAY_IN
        self.exec_user = f"{USER_UID}:{USER_UID}"  # every exec's user (the container's may be root)
        self.client: Any = None
        self._exec_client: Any = None
        self.container: Any = None
        self.container_id: str | None = None
        self._run_dir: Path | None = None
        self._relays: dict[tuple[str, int], Relay | MuxRelay] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Place, pull/build the image, create the container; retried on another host if one fails.
        An image that cannot be had is not retried here (the image cache already did)."""
        failed: list[DockerHost] = []

        def once() -> None:
            self.host = self.pool.acquire(exclude=failed)
            try:
                self.host.images.ensure(self.image, self.image_context)
                self._create()
            except Exception as exc:
                if not (isinstance(exc, InfraError) and exc.kind == "image"):
                    failed.append(self.host)
                    self.pool.mark_failed(self.host, exc)
                self._discard_container()
                self.pool.release(self.host)
                self.host = None
                raise

        def retry(exc: BaseException) -> bool:
            return transient(exc) and not (isinstance(exc, InfraError) and exc.kind in ("image", "host"))

        with_retries(once, self.retries, "start", f"starting a sandbox from {self.image}", retry_if=retry)
        self.baseline()

    def _create(self) -> None:

        host = self.host
        assert host is not None  # start() placed the sandbox first
        self.client = host.client()
        self._exec_client = host.client(timeout=EXEC_READ_TIMEOUT)
        config: Any = self.client.api.inspect_image(self.image).get("Config") or {}
        self.workdir = (
            config.get("WorkingDir") if config.get("WorkingDir") not in (None, "", "/") else "/workspace"
        )
        env = {"HOME": self.home}
        caps = {}
        if host.local:
            mounts = self._local_mounts()
        else:
            mounts = docker_remote.use_tools_volume(self, host, config, env)
        user = f"{USER_UID}:{USER_UID}"
        if self.image != DEFAULT_TAG:
            # The container's own process (docker-init + sleep) is root with CAP_CHOWN alone, for the
            # one hand-over exec below; every other exec runs as uid 1000, which keeps no capability.
            caps, user = {"cap_add": ["CHOWN"]}, "0:0"
        limits: dict[str, int] = {}
        if self.memory:
            limits |= {"mem_limit": self.memory, "memswap_limit": self.memory}
        if self.pids:
            limits["pids_limit"] = self.pids
        if self.cpus:
            limits["nano_cpus"] = int(self.cpus * 1e9)
        self.container = self.client.containers.run(
            self.image,
            command=["sleep", "infinity"],
            entrypoint=[],
            name=f"polar-{self.owner}-{uuid.uuid4().hex[:10]}",
            detach=True,
            init=True,  # reaps the orphans harnesses leave behind
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            user=user,
            working_dir=self.workdir,
            environment=env,
            labels={LABEL: "1", OWNER_LABEL: self.owner, CREATOR_LABEL: creator.host_tag()},
            mounts=mounts,
            **caps,
            **limits,
        )
        self.container_id = self.container.id
        if caps:
            self._hand_over_workdir()

    def _local_mounts(self) -> list:
        from docker.types import Mount

        self._run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{self.owner}-"))
        self._run_dir.chmod(0o755)
        mounts = [
            Mount(RUN_IN, str(self._run_dir), type="bind", read_only=True),
            Mount(RELAY_IN, str(Path(__file__).with_name("relay.py")), type="bind", read_only=True),
        ]
        if self.host_prefix:
            mounts.append(
                Mount(PREFIX_IN, str(Path(self.host_prefix).resolve()), type="bind", read_only=True)
            )
        if self.node:
            mounts.append(
                Mount("/usr/local/bin/node", str(Path(self.node).resolve()), type="bind", read_only=True)
            )
        if self.host_pydeps:
            mounts.append(Mount(PYDEPS_IN, self.host_pydeps, type="bind", read_only=True))
        return mounts

    def _hand_over_workdir(self) -> None:
        """A per-task image's workspace and home become the sandbox user's (they are root's in
        SWE-bench and most Harbor images)."""
        u, w, h = USER_UID, self.workdir, self.home
        owned = " ".join(shlex.quote(p) for p in (h, *self.owned_paths))
        script = (
            f"set -e; mkdir -p {w} {owned} /tmp; chown {u}:{u} {owned}; "
            f'[ "$(stat -c %u {w})" = {u} ] || chown -R {u}:{u} {w}'
        )
        api = self.client.api
        exec_id = api.exec_create(self.container_id, ["sh", "-c", script], user="0")["Id"]
        out = api.exec_start(exec_id)
        if api.exec_inspect(exec_id)["ExitCode"] != 0:
            raise InfraError("start", f"could not hand {w} to uid {u} in {self.image}: {out[-500:]!r}")

    def _discard_container(self) -> None:
        if self.container is not None:
            try:
                self.container.remove(force=True, v=True)
            except Exception as exc:
                log.debug("removing a half-started container failed: %s", exc)
        self.container = None
        self.container_id = None
        self._close_clients()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    def _close_clients(self) -> None:
        for client in (self.client, self._exec_client):
            if client is not None:
                client.close()
        self.client = self._exec_client = None

    def stop(self) -> None:
        if self.container is not None:
            import docker

            try:
                self.container.remove(force=True, v=True)
            except docker.errors.NotFound:
                pass  # already removed (by a sweep, or the engine restarted)
            except Exception as exc:
                if not transient(exc):
                    raise
            self.container = None
        for relay in self._relays.values():
            relay.close()
        self._relays.clear()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
        self._close_clients()
        if self.host is not None:
            self.pool.release(self.host)
            self.host = None
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- gateway -------------------------------------------------------------------------------
    def expose_gateway(self, url: str) -> str:
        """Relay a gateway on this host into the container; returns the URL to use inside."""
        inside, host, port, _ = inside_url(url)  # the container may listen below 1024
        if (host, port) in self._relays:
            return inside
        if self.host is None or self.container_id is None:
            raise RuntimeError("sandbox not started (call start() first)")
        if not self.host.local:
            self._relays[(host, port)] = docker_remote.start_mux_relay(
                self._exec_client.api, self.container_id, port, host, port, user=self.exec_user
            )
            return inside
        assert self._run_dir is not None  # _local_mounts made it for a local host
        sock_name = f"gw-{port}.sock"
        self._relays[(host, port)] = unix_to_tcp(str(self._run_dir / sock_name), host, port)
        relay = ["python3", "-I", "-S", RELAY_IN, "tcp2unix", f"127.0.0.1:{port}", f"{RUN_IN}/{sock_name}"]
        exec_id = self.client.api.exec_create(self.container_id, relay, user=self.exec_user)["Id"]
        self.client.api.exec_start(exec_id, detach=True)
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1).close()"
        deadline = time.monotonic() + 10
        while self.exec(["python3", "-c", probe]).exit_code != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway relay for port {port} did not come up in the container")
            time.sleep(0.05)
        return inside

    # -- exec ----------------------------------------------------------------------------------
    def exec(
        self,
        command: str | list[str],
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        argv = ["bash", "-lc", command] if isinstance(command, str) else list(command)
        if stdin is not None:
            path = f"/tmp/.polar-stdin-{uuid.uuid4().hex}"
            self.put_file(path, stdin.encode(), mode=0o600)
            argv = ["sh", "-c", f'"$@" < {path}; rc=$?; rm -f {path}; exit $rc', "polar-stdin", *argv]
        timeout = timeout if timeout is not None else self.default_timeout
        if timeout is not None:
            # GNU timeout leads a process group and SIGKILLs the whole group when time is up.
            argv = ["timeout", "-s", "KILL", f"{timeout:.3f}s", *argv]
        cwd = workdir or self.workdir
        if not cwd.startswith("/"):
            cwd = f"{self.workdir}/{cwd}"
        t0 = time.monotonic()
        out, err, code = self._run_exec(argv, env or {}, cwd)
        duration = time.monotonic() - t0
        timed_out = timeout is not None and code == 137 and duration >= timeout - 0.05
        return ExecResult(
            exit_code=code if code is not None else -1,
            stdout=(out or b"").decode(errors="replace"),
            stderr=(err or b"").decode(errors="replace"),
            timed_out=timed_out,
            duration_s=duration,
        )

    def _run_exec(self, argv: list[str], env: dict[str, str], cwd: str) -> tuple[bytes, bytes, int | None]:
        """Create and run an exec. A failed start is retried only when the engine says the exec
        never ran (a command is not idempotent); otherwise, and when the engine stays unreachable,
        InfraError("exec")."""
        api = self._api
        for attempt in range(1, self.retries.attempts + 1):
            exec_id = self._retry(
                "exec",
                "creating an exec",
                lambda: api.exec_create(
                    self.container_id, argv, environment=env, workdir=cwd, user=self.exec_user
                )["Id"],
            )
            try:
                out, err = self._exec_client.api.exec_start(exec_id, demux=True)
            except Exception as exc:
                if not transient(exc):
                    raise
                state = self._retry("exec", "inspecting a failed exec", lambda e=exec_id: api.exec_inspect(e))
                if state.get("Running") or state.get("Pid") or state.get("ExitCode") is not None:
                    raise InfraError("exec", f"the exec stream broke while {argv[:3]} ran: {exc}") from exc
                if attempt == self.retries.attempts:
                    raise InfraError("exec", f"exec never started: {exc}", attempt) from exc
                time.sleep(self.retries.delay(attempt))
                continue
            code = self._retry(
                "exec", "reading an exit code", lambda e=exec_id: api.exec_inspect(e)["ExitCode"]
            )
            return out, err, code
        raise AssertionError("unreachable")

    def _retry(self, kind: str, what: str, fn, retry_if=transient):
        def failed(exc: BaseException) -> None:
            if self.host is not None:
                self.pool.mark_failed(self.host, exc)

        return with_retries(fn, self.retries, kind, what, retry_if=retry_if, on_failure=failed)

    @property
    def _api(self):
        if self.client is None or self.container_id is None:
            raise RuntimeError("sandbox not started (call start() first)")
        return self.client.api

    # -- diff ----------------------------------------------------------------------------------
    def baseline(self) -> str:
        res = self.exec(["bash", "-c", gitdiff.baseline_script(GIT_DIR_IN, self.workdir)])
        if res.exit_code != 0:
            raise RuntimeError(f"baseline commit failed: {res.stderr.strip()}")
        return res.stdout.strip()

    def diff(self, exclude: tuple[str, ...] = ()) -> str:
        script = gitdiff.diff_script(GIT_DIR_IN, self.workdir, gitdiff.HARNESS_STATE_DIRS + exclude)
        res = self.exec(["bash", "-c", script])
        if res.exit_code != 0:
            raise RuntimeError(f"workspace diff failed: {res.stderr.strip()}")
        return res.stdout


def sweep_docker(client, owner: str | None = None, *, dead_only: bool = False) -> int:
    """Remove every polar_pl sandbox container (of `owner`, or all); dead_only: only those whose
    creating process (on this host) is gone. Returns how many."""
    labels = [f"{LABEL}=1"] + ([f"{OWNER_LABEL}={owner}"] if owner else [])
    n = 0
    for c in client.containers.list(all=True, filters={"label": labels}):
        if dead_only and creator.host_alive(c.labels.get(CREATOR_LABEL)):
            continue
        c.remove(force=True, v=True)
        n += 1
    if not dead_only:  # relay folders of live runs are not told apart: only a full sweep takes them
        for d in Path(tempfile.gettempdir()).glob(f"{RUN_PREFIX}{owner + '-' if owner else ''}*"):
            shutil.rmtree(d, ignore_errors=True)
    return n
