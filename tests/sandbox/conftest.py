"""Sandbox fixtures: one `sandbox` per backend (local, local+bwrap, docker), plus small HTTP servers
standing in for the gateway (what is under test here is the sandbox, not the gateway)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from polar_pl.utils.serving import ServerThread

BACKENDS = ["local", "bwrap", "docker"]
REPO = Path(__file__).resolve().parents[2]


# -- a real Docker engine ------------------------------------------------------------------------
# `docker_engine`: a private dockerd started as root with its own data root and socket, stopped by
# pid at the end; `docker_image`: the offline base image, imported once. Self-contained (meant to
# move to tests/conftest.py as is). Skipped with the reason only when not root or dockerd cannot be
# installed/started. POLAR_DOCKERD_ROOT (default .cache/dockerd) keeps the image between runs.


@pytest.fixture(scope="session")
def docker_engine():
    from polar_pl.sandbox.dockerd import DockerDaemon, DockerUnavailable

    if os.geteuid() != 0:
        pytest.skip("docker tests need root to start a private dockerd")
    daemon = DockerDaemon(root=os.environ.get("POLAR_DOCKERD_ROOT", REPO / ".cache" / "dockerd"))
    try:
        daemon.start()
    except DockerUnavailable as e:
        pytest.skip(f"no Docker engine: {e}")
    yield daemon
    import docker

    from polar_pl.sandbox.docker import sweep_docker

    client = docker.DockerClient(base_url=daemon.url)
    sweep_docker(client, owner="pytest")  # whatever a failed test left behind
    client.close()
    daemon.stop()


@pytest.fixture(scope="session")
def docker_image(docker_engine) -> str:
    import docker

    from polar_pl.sandbox.image import build_image, pydeps_dir

    client = docker.DockerClient(base_url=docker_engine.url, timeout=600)
    try:
        pydeps_dir()
        return build_image(client)
    finally:
        client.close()


# -- sandboxes -----------------------------------------------------------------------------------


def _factory(kind: str, request, **limits):
    from polar_pl.sandbox.local import LocalSandbox

    if kind == "local":
        return lambda: LocalSandbox(owner="pytest", **limits)
    if kind == "bwrap":
        if not shutil.which("bwrap"):
            pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
        return lambda: LocalSandbox(isolation="bwrap", owner="pytest", **limits)
    engine = request.getfixturevalue("docker_engine")
    image = request.getfixturevalue("docker_image")
    from polar_pl.sandbox.docker import DockerSandbox

    return lambda: DockerSandbox(image=image, docker_host=engine.url, owner="pytest", **limits)


@pytest.fixture(params=BACKENDS)
def make_sandbox(request):
    return _factory(request.param, request)


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
