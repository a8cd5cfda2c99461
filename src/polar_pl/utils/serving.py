"""Run an ASGI app with uvicorn on a background thread (in-process servers for the gateway,
the embedded engine and tests), with a clean stop; `Server`, uvicorn's server with a hook at the
start of its shutdown (the gateway's, which aborts its calls in flight there)."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import uvicorn


class Server(uvicorn.Server):
    """uvicorn's server; `on_shutdown` runs on the server's loop when its shutdown begins, before
    uvicorn waits for the requests in flight: what it cancels there ends now, not when the
    longest request would have (uvicorn's own wait is `timeout_graceful_shutdown`)."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], object] | None = None):
        super().__init__(config)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets=None) -> None:
        if self.on_shutdown is not None:
            self.on_shutdown()
        await super().shutdown(sockets)


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Ray gives its workers ports 10002-19999 by default
_LOWEST = 20000
_RNG = random.SystemRandom()


def free_port(host: str = "127.0.0.1") -> int:
    """A free port below the kernel's ephemeral range, drawn at random. A port the kernel assigned
    (bind to port 0) is a port it hands out again, to the next outgoing connection or port-0 bind:
    a server started as a process (vLLM imports for ~20 s before it binds) then finds it taken
    ("Address already in use", seen in CI). Drawn with the system's randomness: a seeded `random`
    would give every process of a seeded run the same port."""
    try:
        ephemeral_lo = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_lo = 0
    if ephemeral_lo - _LOWEST >= 1000:
        for _ in range(100):
            port = _RNG.randrange(_LOWEST, ephemeral_lo)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # no room below the range (or all taken): the kernel's pick
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """`with ServerThread(app) as srv: srv.url` — uvicorn on its own thread and event loop.
    on_shutdown: see `Server`."""

    def __init__(
        self,
        app,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_level: str = "warning",
        on_shutdown: Callable[[], object] | None = None,
    ):
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(app, host=host, port=self.port, log_level=log_level, lifespan="on")
        self.server = Server(config, on_shutdown)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn:{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> Self:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"server on port {self.port} failed to start")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} did not start in {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
