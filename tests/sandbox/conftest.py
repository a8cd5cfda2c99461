"""Sandbox fixtures: one `sandbox` per backend (unsafe_local, bwrap, docker), plus small HTTP servers
standing in for the gateway (what is under test here is the sandbox, not the gateway)."""

from __future__ import annotations

import shutil
import warnings

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from polar_pl.testing.sandbox import (  # noqa: F401  (a real dockerd; the leftover check)
    OWNER,
    docker_engine,
    docker_image,
    no_sandbox_leftovers,
)
from polar_pl.utils.serving import ServerThread

BACKENDS = ["unsafe_local", "bwrap", "docker"]


# -- sandboxes -----------------------------------------------------------------------------------


def _factory(kind: str, request, **limits):
    from polar_pl.sandbox.local import LocalSandbox, UnsafeSandboxWarning

    if kind == "unsafe_local":

        def unsafe():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UnsafeSandboxWarning)
                return LocalSandbox(isolation="none", owner=OWNER, **limits)

        return unsafe
    if kind == "bwrap":
        if not shutil.which("bwrap"):
            pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
        return lambda: LocalSandbox(isolation="bwrap", owner=OWNER, **limits)
    engine = request.getfixturevalue("docker_engine")
    image = request.getfixturevalue("docker_image")
    from polar_pl.sandbox.docker import DockerSandbox

    return lambda: DockerSandbox(image=image, docker_host=engine.url, owner=OWNER, **limits)


@pytest.fixture(params=BACKENDS)
def make_sandbox(request):
    return _factory(request.param, request)


@pytest.fixture(params=["bwrap", "docker"])
def make_isolated(request):
    """The isolating backends, built with given constructor options: `make_isolated(**options)`."""
    return lambda **options: _factory(request.param, request, **options)()


@pytest.fixture
def sandbox(make_sandbox):
    sb = make_sandbox()
    sb.start()
    yield sb
    sb.stop()


@pytest.fixture(params=BACKENDS)
def limited_sandbox(request):
    from polar_pl.sandbox import cgroups

    if request.param != "docker" and not cgroups.available():
        pytest.skip("local limits need root and a writable cgroup hierarchy")
    sb = _factory(request.param, request, memory="256m", pids=64, cpus=1)()
    sb.start()
    yield sb
    sb.stop()


def _app(text: str) -> Starlette:
    return Starlette(routes=[Route("/ping", lambda r: PlainTextResponse(text))])


@pytest.fixture(scope="module")
def gateway_stub():
    with ServerThread(_app("pong")) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def other_server():
    with ServerThread(_app("pong")) as srv:
        yield srv.url
