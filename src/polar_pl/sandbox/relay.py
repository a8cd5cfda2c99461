"""A byte relay between a TCP port and a unix socket: how a network-less sandbox reaches the gateway.

A sandbox without a network (bubblewrap `--unshare-net`, Docker `network_mode="none"`) still shares
the filesystem with the host, and unix sockets work across network namespaces. So the host runs a
unix -> TCP relay (a thread in this process) next to the gateway, and inside the sandbox a TCP ->
unix relay listens on the gateway's own `127.0.0.1:<port>`: the harness keeps the gateway URL it was
given and reaches nothing else.

A container on a *remote* Docker host shares no filesystem with this one, so there the relay is
multiplexed over the one channel we already have to the container: the stdin/stdout of a
`docker exec` (over the engine API's own TLS or SSH connection). Inside, `relay.py mux` listens on
`127.0.0.1:<port>` and frames every accepted connection onto its stdout; here, `MuxRelay` reads
those frames and opens one connection to the gateway per inside connection. The container keeps
`network_mode="none"`: it reaches nothing but the gateway, and the remote host needs no route to us.

This file is stdlib-only and also runs as a script inside the sandbox (the container's python3):
    python3 relay.py tcp2unix HOST:PORT SOCKET [-- COMMAND ...]
    python3 relay.py mux HOST:PORT
With a command, tcp2unix serves while the command runs and exits with its status (one bubblewrap
exec); without one it serves forever (the container's main process).
"""

from __future__ import annotations

import os
import socket
import struct
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


SUN_PATH_MAX = 107  # a unix socket's path is at most 108 bytes with its NUL


def _unix_call(sock: socket.socket, method: str, path: str) -> None:
    """sock.bind/connect(path), also for a path longer than a unix socket's limit (a deep temporary
    folder): then through `/proc/self/fd/<fd of its folder>/<name>`, which the kernel resolves."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        getattr(sock, method)(path)
        return
    folder, name = os.path.split(path)
    fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        getattr(sock, method)(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


def unix_to_tcp(sock_path: str, host: str, port: int) -> Relay:
    """Host side: listen on a unix socket, forward to the gateway's TCP port."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    _unix_call(listener, "bind", sock_path)
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
        _unix_call(s, "connect", sock_path)
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


# -- multiplexed relay over one byte stream ------------------------------------------------------
# A frame: connection id (u32), type (u8), payload length (u32), payload. The host starts the
# conversation with HELLO, so that nothing the container writes can arrive before the engine's
# HTTP upgrade response has been read; the container answers READY once it listens.
OPEN, DATA, CLOSE, HELLO, READY = range(5)
_HEAD = struct.Struct(">IBI")


def _read_exactly(read, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


class _FrameWriter:
    def __init__(self, write) -> None:
        self._write, self._lock = write, threading.Lock()

    def send(self, conn: int, kind: int, payload: bytes = b"") -> None:
        with self._lock:
            self._write(_HEAD.pack(conn, kind, len(payload)) + payload)


def _pump_frames(sock: socket.socket, conn: int, out: _FrameWriter) -> None:
    try:
        while data := sock.recv(65536):
            out.send(conn, DATA, data)
    except OSError:
        pass
    try:
        out.send(conn, CLOSE)
    except OSError:
        pass


def _deliver(conns: dict, conn: int, kind: int, payload: bytes) -> None:
    sock = conns.get(conn)
    if sock is None:
        return
    try:
        if kind == DATA:
            sock.sendall(payload)
        else:  # CLOSE: the other side is done writing
            sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def mux_inside(host: str, port: int, read, write) -> None:
    """Container side: accept on host:port, frame each connection onto `write`, deliver from `read`."""
    out, conns = _FrameWriter(write), {}
    _read_exactly(read, _HEAD.size)  # HELLO
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)

    def accept() -> None:
        n = 0
        while True:
            client, _ = listener.accept()
            n += 1
            conns[n] = client
            out.send(n, OPEN)
            threading.Thread(target=_pump_frames, args=(client, n, out), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    out.send(0, READY)
    while True:
        conn, kind, size = _HEAD.unpack(_read_exactly(read, _HEAD.size))
        _deliver(conns, conn, kind, _read_exactly(read, size) if size else b"")


class MuxRelay:
    """Host side of `relay.py mux`: `sock` is the hijacked socket of the exec (stdin raw, stdout in
    the engine's 8-byte-header stream frames); each inside connection gets one `connect()`."""

    def __init__(self, sock, connect) -> None:
        self.sock, self.connect = sock, connect
        raw_write = getattr(sock, "sendall", None) or _writer(sock)
        self._read = getattr(sock, "recv", None) or sock.read
        self.out = _FrameWriter(raw_write)
        self.conns: dict[int, socket.socket] = {}
        self._buf = b""
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="polar-mux", daemon=True)

    def start(self, timeout: float = 10.0) -> MuxRelay:
        self.out.send(0, HELLO)
        self.thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the relay in the container did not come up")
        return self

    def _stdout(self, n: int) -> bytes:
        """Read n bytes of the exec's stdout, unwrapping the engine's stream frames."""
        while len(self._buf) < n:
            stream, size = struct.unpack(">BxxxL", _read_exactly(self._read, 8))
            data = _read_exactly(self._read, size) if size else b""
            if stream == 1:
                self._buf += data
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _serve(self) -> None:
        try:
            while True:
                conn, kind, size = _HEAD.unpack(self._stdout(_HEAD.size))
                payload = self._stdout(size) if size else b""
                if kind == READY:
                    self._ready.set()
                elif kind == OPEN:
                    self._open(conn)
                else:
                    _deliver(self.conns, conn, kind, payload)
        except (EOFError, OSError, struct.error):
            self.close()

    def _open(self, conn: int) -> None:
        try:
            upstream = self.connect()
        except OSError:
            self.out.send(conn, CLOSE)
            return
        self.conns[conn] = upstream
        threading.Thread(target=_pump_frames, args=(upstream, conn, self.out), daemon=True).start()

    def close(self) -> None:
        for s in list(self.conns.values()):
            try:
                s.close()
            except OSError:
                pass
        self.conns.clear()
        try:
            self.sock.close()
        except OSError:
            pass


def _writer(sock):
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = sock.write(view)
            view = view[n:]

    return write


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "mux":
        host, _, port = argv[1].rpartition(":")
        stdin, stdout = sys.stdin.buffer.raw, sys.stdout.buffer.raw  # type: ignore[union-attr]  # stdio buffers are Buffered*

        def write(data: bytes) -> None:
            view = memoryview(data)
            while view:
                view = view[stdout.write(view) :]

        try:
            mux_inside(host, int(port), stdin.read, write)
        except EOFError:
            return 0
        return 0
    if len(argv) < 3 or argv[0] != "tcp2unix":
        print(
            "usage: relay.py tcp2unix HOST:PORT SOCKET [-- COMMAND ...] | relay.py mux HOST:PORT",
            file=sys.stderr,
        )
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
