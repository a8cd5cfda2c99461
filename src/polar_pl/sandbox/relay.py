"""A byte relay between a TCP port and a unix socket: how a network-less sandbox reaches the gateway.

A sandbox without a network (bubblewrap `--unshare-net`, Docker `network_mode="none"`) still shares
the filesystem with the host, and unix sockets work across network namespaces. So the host runs a
unix -> TCP relay (a thread in this process) next to the gateway, and inside the sandbox a TCP ->
unix relay listens on the gateway's own `127.0.0.1:<port>`: the harness keeps the gateway URL it was
given and reaches nothing else.

This file is stdlib-only and also runs as a script inside the sandbox (the container's python3):
    python3 relay.py tcp2unix HOST:PORT SOCKET [-- COMMAND ...]
With a command, the relay serves while the command runs and exits with its status (one bubblewrap
exec); without one it serves forever (the container's main process).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        # Half-close so the other direction can finish (HTTP keeps reading after the request).
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _bridge(client: socket.socket, connect) -> None:
    try:
        upstream = connect()
    except OSError:
        client.close()
        return
    t = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    t.start()
    _pump(client, upstream)
    t.join()
    client.close()
    upstream.close()


class Relay:
    """Accept on `listener`, connect each client with `connect()`, copy bytes both ways."""

    def __init__(self, listener: socket.socket, connect) -> None:
        self.listener = listener
        self.connect = connect
        self._closed = False
        self.thread = threading.Thread(target=self._serve, name="polar-relay", daemon=True)

    def start(self) -> Relay:
        self.thread.start()
        return self

    def _serve(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=_bridge, args=(client, self.connect), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


def unix_to_tcp(sock_path: str, host: str, port: int) -> Relay:
    """Host side: listen on a unix socket, forward to the gateway's TCP port."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    os.chmod(sock_path, 0o777)  # the sandbox user may not be the host user
    listener.listen(128)
    return Relay(listener, lambda: socket.create_connection((host, port), timeout=None)).start()


def tcp_to_unix(host: str, port: int, sock_path: str) -> Relay:
    """Sandbox side: listen on host:port, forward to the unix socket."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
        return s

    return Relay(listener, connect).start()


PRIVILEGED_SHIFT = 20000  # bwrap: an unprivileged user cannot listen below 1024, 80 is 20080 inside


def inside_url(url: str, shift_privileged: bool = False) -> tuple[str, str, int, int]:
    """(URL to use inside the sandbox, host, port, port inside): the relay listens on the sandbox's
    own 127.0.0.1 at the gateway's port, whatever host name the gateway was given under (a port
    below 1024 moves up by PRIVILEGED_SHIFT when `shift_privileged`)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    inside = port + PRIVILEGED_SHIFT if shift_privileged and port < 1024 else port
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{inside}")), host, port, inside


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "tcp2unix":
        print("usage: relay.py tcp2unix HOST:PORT SOCKET [-- COMMAND ...]", file=sys.stderr)
        return 2
    host, _, port = argv[1].rpartition(":")
    relay = tcp_to_unix(host, int(port), argv[2])
    command = argv[4:] if len(argv) > 3 and argv[3] == "--" else []
    if not command:
        relay.thread.join()
        return 0
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
