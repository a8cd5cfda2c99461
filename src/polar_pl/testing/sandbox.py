"""Pytest fixtures for a real Docker engine, importable by any conftest:

    from polar_pl.testing.sandbox import docker_engine, docker_image, no_sandbox_leftovers  # noqa: F401

`docker_engine`: a private dockerd started as root with its own data root, exec root, pidfile and
socket (dockerd.py), stopped by pid at the end of the session after removing the test containers;
`docker_image`: the offline base image (and the mini agent's pydeps folder), imported once.
Tests are skipped, with the reason, only when not root or dockerd cannot be installed / started.
POLAR_DOCKERD_ROOT (default <cwd>/.cache/dockerd) keeps the image between runs; each pytest-xdist
worker gets its own engine below it (one shared engine would be stopped by whichever worker ends
first, under the other's tests).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Owner label of every sandbox a test session makes: per process, so parallel sessions never
# sweep each other's sandboxes.
OWNER = f"pytest-{os.getpid()}"


def leftovers(owner: str = OWNER, client=None) -> list[str]:
    """What sandboxes of `owner` left behind: workspaces, relay folders, cgroups, containers."""
    import tempfile

    from polar_pl.sandbox import cgroups
    from polar_pl.sandbox.docker import LABEL, OWNER_LABEL, RUN_PREFIX
    from polar_pl.sandbox.local import TMP_PREFIX

    tmp = Path(tempfile.gettempdir())
    found = [str(p) for prefix in (TMP_PREFIX, RUN_PREFIX) for p in tmp.glob(f"{prefix}{owner}-*")]
    for parent in (cgroups.ROOT / cgroups.PARENT, cgroups.ROOT / "pids" / cgroups.PARENT):
        if parent.is_dir():
            found += [str(d) for d in parent.iterdir() if d.is_dir() and d.name.startswith(f"{owner}.")]
    root_prefix = f"{tmp}/{TMP_PREFIX}{owner}-"
    for proc in Path("/proc").iterdir():  # processes still running in (or from) a sandbox root
        if proc.name.isdigit():
            try:
                where = (
                    os.readlink(proc / "cwd") + " " + (proc / "cmdline").read_bytes().decode(errors="replace")
                )
            except OSError:
                continue
            if root_prefix in where:
                found.append(f"process {proc.name}: {where[:120]}")
    if client is not None:
        labels = [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]
        found += [f"container {c.name}" for c in client.containers.list(all=True, filters={"label": labels})]
    return found


@pytest.fixture(scope="session", autouse=True)
def no_sandbox_leftovers():
    """Fails the session's teardown if any sandbox of this session was not cleaned up."""
    yield
    left = leftovers()
    assert not left, f"sandboxes left behind: {left}"


@pytest.fixture(scope="session")
def docker_engine():
    from polar_pl.sandbox.dockerd import DockerDaemon, DockerUnavailable

    if os.geteuid() != 0:
        pytest.skip("docker tests need root to start a private dockerd")
    root = Path(os.environ.get("POLAR_DOCKERD_ROOT", Path.cwd() / ".cache" / "dockerd"))
    daemon = DockerDaemon(root=root / os.environ.get("PYTEST_XDIST_WORKER", ""))
    try:
        daemon.start()
    except DockerUnavailable as e:
        pytest.skip(f"no Docker engine: {e}")
    yield daemon
    import docker

    from polar_pl.sandbox.docker import sweep_docker

    client = docker.DockerClient(base_url=daemon.url)
    left = leftovers(OWNER, client)
    sweep_docker(client, owner=OWNER)  # whatever a failed test left behind
    client.close()
    daemon.stop()
    assert not left, f"containers left behind: {left}"


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
