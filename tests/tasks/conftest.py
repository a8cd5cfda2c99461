"""Task-test fixtures: sandbox factories per backend (local always; docker through the real
private dockerd fixture, skipped with its reason where Docker cannot run)."""

from __future__ import annotations

import pytest

from polar_pl.testing.sandbox import OWNER, docker_engine, docker_image  # noqa: F401  (real dockerd)


@pytest.fixture
def local_factory():
    from polar_pl.sandbox.local import LocalSandbox

    return lambda: LocalSandbox(owner=OWNER)


@pytest.fixture
def docker_factory(docker_engine, docker_image):  # noqa: F811
    from polar_pl.sandbox.docker import DockerSandbox

    return lambda: DockerSandbox(image=docker_image, docker_host=docker_engine.url, owner=OWNER)


@pytest.fixture
def builtin_tasks():
    from polar_pl.tasks.sources import BuiltinTaskSource

    return {t.instance_id: t for t in BuiltinTaskSource().tasks()}
