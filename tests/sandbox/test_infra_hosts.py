"""Retries, infrastructure errors, image references and host placement, without a Docker engine
(the placement tests stand in for the engines' health answers: the pool's logic is under test)."""

from __future__ import annotations

import docker
import pytest
import requests

from polar_pl.sandbox.hosts import HostPool, HostSpec
from polar_pl.sandbox.images import base_images, split_reference, swebench_image, swegym_image
from polar_pl.sandbox.infra import InfraError, RetryPolicy, with_retries

FAST = RetryPolicy(attempts=3, backoff_s=0.0)


def test_transient_failures_are_retried_then_raised_as_infra_errors():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise requests.exceptions.ConnectionError("engine restarting")
        return "ok"

    assert with_retries(flaky, FAST, "exec", "probe") == "ok" and len(calls) == 3
    with pytest.raises(InfraError, match="after 3 attempts") as info:
        with_retries(lambda: (_ for _ in ()).throw(docker.errors.APIError("500 boom")), FAST, "copy", "x")
    assert info.value.kind == "copy" and info.value.attempts == 3


def test_caller_errors_are_not_retried():
    calls = []

    def bad():
        calls.append(1)
        raise ValueError("a bug, not the infrastructure")

    with pytest.raises(ValueError):
        with_retries(bad, FAST, "exec", "probe")
    assert calls == [1]


def test_retry_policy_from_config():
    assert RetryPolicy.of(5).attempts == 5
    assert RetryPolicy.of({"attempts": 2, "backoff_s": 0.5}).backoff_s == 0.5
    with pytest.raises(ValueError, match="sandbox.retries.attempts"):
        RetryPolicy(attempts=0)
    delays = [RetryPolicy(backoff_s=1, max_backoff_s=4).delay(n) for n in (1, 2, 3, 4)]
    assert 0.75 <= delays[0] <= 1.25 and 3 <= delays[3] <= 5  # doubles, capped, jittered


def test_image_names_of_the_public_datasets():
    assert (
        swebench_image("django__django-11099") == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )
    assert swegym_image("getmoto__moto-6868") == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-6868:latest"
    assert split_reference("127.0.0.1:5000/team/img:3") == ("127.0.0.1:5000", "team/img", "3")
    assert split_reference("namanjain12/pandas_final") == (None, "namanjain12/pandas_final", "latest")
    assert split_reference("localhost/x:y") == ("localhost", "x", "y")


def test_dockerfile_base_images():
    df = (
        "FROM polar-pl/sandbox:bookworm AS build\nRUN true\nFROM --platform=linux/amd64 build\nFROM scratch\n"
    )
    assert base_images(df) == ["polar-pl/sandbox:bookworm"]


def test_host_specs():
    spec = HostSpec.of({"url": "tcp://10.0.0.5:2376", "capacity": 8, "cert_path": "/certs"})
    assert (spec.capacity, spec.ca_cert, spec.client_key, spec.local) == (
        8,
        "/certs/ca.pem",
        "/certs/key.pem",
        False,
    )
    assert HostSpec.of("unix:///run/docker.sock").local and not HostSpec.of("ssh://u@h").local
    with pytest.raises(ValueError, match="unknown keys"):
        HostSpec.of({"url": "tcp://h:1", "capcity": 3})
    with pytest.raises(ValueError, match="not a unix://"):
        HostSpec.of("docker.example.com")


def _pool(health: dict[str, bool], capacity: dict[str, int | None]) -> HostPool:
    pool = HostPool([{"url": u, "capacity": c} for u, c in capacity.items()], health_interval_s=0.0)
    for h in pool.hosts:
        h.ping = lambda timeout=5.0, u=h.url: health[u]
    return pool


def test_least_loaded_placement_with_capacity_and_health():
    health = {"tcp://a:1": True, "tcp://b:1": True}
    pool = _pool(health, {"tcp://a:1": 1, "tcp://b:1": 4})
    placed = [pool.acquire().url for _ in range(4)]
    assert placed == ["tcp://a:1", "tcp://b:1", "tcp://b:1", "tcp://b:1"]  # a is full after one
    pool.release(pool.hosts[0])
    health["tcp://a:1"] = False  # a went away: nothing more lands there
    assert pool.acquire().url == "tcp://b:1"
    health["tcp://b:1"] = False
    with pytest.raises(InfraError, match="no healthy docker host") as info:
        pool.acquire()
    assert info.value.kind == "host"
    pool.close()
