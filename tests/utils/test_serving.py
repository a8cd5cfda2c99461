"""free_port: a port the kernel does not hand out on its own while the caller's server starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from polar_pl.utils.serving import free_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="Linux only: the kernel's ephemeral port range")
def test_free_port_is_outside_the_range_the_kernel_assigns():
    # The attack: a vLLM server gets its port, takes ~20 s to import and bind, and meanwhile a
    # connection from another test (or a server binding port 0) is given the same port by the
    # kernel: "Address already in use" (CI, stop 45). Ports the kernel assigns come from this range.
    lo, hi = map(int, RANGE.read_text().split())
    ports = {free_port() for _ in range(200)}
    assert all(not lo <= p <= hi for p in ports), sorted(p for p in ports if lo <= p <= hi)
    assert len(ports) > 150  # drawn at random: two servers starting at once do not share one
    with socket.socket() as s:  # and it is free
        s.bind(("127.0.0.1", ports.pop()))


def test_free_port_skips_a_port_in_use():
    held = []
    try:
        for _ in range(50):
            s = socket.socket()
            s.bind(("127.0.0.1", free_port()))
            held.append(s)  # every port returned could be bound: none handed out twice
        assert len({s.getsockname()[1] for s in held}) == 50
    finally:
        for s in held:
            s.close()
