"""Sandbox configs compose to factories, and `polar-pl sandbox cleanup` removes what a crashed run
left behind (workspaces, cgroups, labelled containers)."""

from __future__ import annotations

import subprocess
import sys
import uuid
import warnings

import pytest
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from polar_pl.sandbox.docker import DockerSandbox
from polar_pl.sandbox.local import LocalSandbox, UnsafeSandboxWarning
from polar_pl.sandbox.protocol import Sandbox
from polar_pl.testing.sandbox import leftovers


@pytest.mark.parametrize(("choice", "cls", "isolation"), [
    ("unsafe_local", LocalSandbox, "none"), ("bwrap", LocalSandbox, "bwrap"), ("docker", DockerSandbox, None),
])  # fmt: skip
def test_sandbox_configs_are_factories(choice, cls, isolation):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"sandbox={choice}"])
    make = instantiate(cfg.sandbox)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb = make()
    assert isinstance(sb, cls) and isinstance(sb, Sandbox)
    if isolation:
        assert sb.isolation == isolation
    unsafe = [w for w in caught if issubclass(w.category, UnsafeSandboxWarning)]
    assert len(unsafe) == (1 if choice == "unsafe_local" else 0)


def test_default_config_isolates():
    """The CPU default ran the agent as host root (sandbox=local, isolation none)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config")
    assert cfg.sandbox.isolation == "bwrap"
    assert LocalSandbox().isolation == "bwrap"  # and so does the class


def test_bad_isolation_is_a_value_error():
    with pytest.raises(ValueError, match="allowed values"):
        LocalSandbox(isolation="chroot")


def _cleanup(*args: str) -> str:
    cmd = [sys.executable, "-m", "polar_pl.cli", "sandbox", "cleanup", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def test_cleanup_after_a_crash_local():
    owner = f"crash-{uuid.uuid4().hex[:8]}"
    from polar_pl.sandbox import cgroups

    limits = {"pids": 32} if cgroups.available() else {}
    sb = LocalSandbox(owner=owner, **limits)
    sb.start()  # ... and the process "dies" without stop()
    assert leftovers(owner)
    out = _cleanup("--owner", owner)
    assert "local workspaces removed: 1" in out
    assert leftovers(owner) == []


@pytest.mark.slow
def test_cleanup_after_a_crash_docker(docker_engine, docker_image):
    import docker

    owner = f"crash-{uuid.uuid4().hex[:8]}"
    sb = DockerSandbox(image=docker_image, docker_host=docker_engine.url, owner=owner)
    sb.start()
    client = docker.DockerClient(base_url=docker_engine.url)
    try:
        assert any("container" in x for x in leftovers(owner, client))
        out = _cleanup("--owner", owner, "--docker-host", docker_engine.url)
        assert "containers removed: 1" in out
        assert leftovers(owner, client) == []
    finally:
        sb.client.close()
        client.close()
