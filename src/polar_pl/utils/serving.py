"""Run an ASGI app with uvicorn on a background thread (in-process servers for the gateway,
the embedded engine and tests), with a clean stop."""

from __future__ import annotations

import socket
import threading
import time
from typing import Self

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """`with ServerThread(app) as srv: srv.url` — uvicorn on its own thread and event loop."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning"):
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(app, host=host, port=self.port, log_level=log_level, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn:{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
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
