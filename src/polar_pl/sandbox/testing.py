"""Pytest fixtures for a real Docker engine, importable by any conftest:

    from polar_pl.sandbox.testing import docker_engine, docker_image  # noqa: F401

`docker_engine`: a private dockerd started as root with its own data root, exec root, pidfile and
socket (dockerd.py), stopped by pid at the end of the session after removing the test containers;
`docker_image`: the offline base image (and the mini agent's pydeps folder), imported once.
Tests are skipped, with the reason, only when not root or dockerd cannot be installed / started.
POLAR_DOCKERD_ROOT (default <cwd>/.cache/dockerd) keeps the image between runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def docker_engine():
    from polar_pl.sandbox.dockerd import DockerDaemon, DockerUnavailable

    if os.geteuid() != 0:
        pytest.skip("docker tests need root to start a private dockerd")
    daemon = DockerDaemon(root=os.environ.get("POLAR_DOCKERD_ROOT", Path.cwd() / ".cache" / "dockerd"))
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
