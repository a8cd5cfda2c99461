"""Per-task images against a real engine and a real registry: built from a task's Dockerfile once
however many sandboxes want it, pulled from the local registry with the Docker config's
credentials after the local copies are deleted, and refused without them."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import docker
import pytest

from polar_pl.sandbox.docker_factory import DockerSandboxes
from polar_pl.sandbox.infra import InfraError
from polar_pl.testing.hosts import dep_image_context, make_wheel
from polar_pl.testing.sandbox import OWNER

pytestmark = pytest.mark.slow
FAST = {"attempts": 2, "backoff_s": 0.1}


def _start_all(sandboxes):
    with ThreadPoolExecutor(len(sandboxes)) as pool:
        return list(pool.map(lambda s: s.start(), sandboxes))


def _value(sb, module: str) -> str:
    res = sb.exec(["python3", "-c", f"import {module}; print({module}.VALUE)"])
    assert res.exit_code == 0, res.stderr
    return res.stdout.strip()


def test_task_image_is_built_once_for_concurrent_sandboxes(docker_engine, docker_image, tmp_path):
    wheel = make_wheel(tmp_path / "w", "polar_dep_c", "1.0", "VALUE = 'c'\n")
    ctx = dep_image_context(tmp_path / "ctx", docker_image, wheel)
    name = f"polar-test/dep-c:{uuid.uuid4().hex[:8]}"
    factory = DockerSandboxes(docker_host=docker_engine.url, owner=OWNER, harness_prefix="", retries=FAST)
    sandboxes = [factory(image=name, image_context=str(ctx)) for _ in range(3)]
    try:
        _start_all(sandboxes)
        for sb in sandboxes:
            assert _value(sb, "polar_dep_c") == "c"
            assert sb.workdir == "/app" and sb.exec(["id", "-u"]).stdout.strip() == "1000"
            assert (
                sb.exec(["sh", "-c", "touch /app/x && grep CapEff /proc/self/status"]).stdout.split()[-1]
                == "0" * 16
            )
        assert dict(factory.pool.hosts[0].images.counts) == {"build": 1}
    finally:
        for sb in sandboxes:
            sb.stop()
        factory.close()
        client = docker.DockerClient(base_url=docker_engine.url)
        client.images.remove(name, force=True)
        client.close()


def test_registry_pull_with_docker_config_credentials(docker_engine, dep_images, registry, tmp_path):
    """push -> delete the local copies -> INIT pulls (each image once) with the config's login."""
    client = docker.DockerClient(base_url=docker_engine.url, timeout=600)
    for name in dep_images.names:
        repo, tag = name.rsplit(":", 1)
        client.images.get(name).tag(f"{registry.address}/{repo}", tag)
        client.images.push(f"{registry.address}/{repo}", tag, auth_config=registry.auth)
        client.images.remove(f"{registry.address}/{name}")
        client.images.remove(name)
    no_login = tmp_path / "config.json"
    no_login.write_text(json.dumps({"auths": {}}))
    refused = DockerSandboxes(docker_host=docker_engine.url, registry=registry.address,
                              docker_config=str(no_login), owner=OWNER, retries=1)  # fmt: skip
    with pytest.raises(InfraError) as info:
        refused(image=dep_images.names[0]).start()
    assert info.value.kind == "image" and "pulling" in str(info.value)
    refused.close()
    factory = DockerSandboxes(docker_host=docker_engine.url, registry=registry.address, max_pulls=1,
                              docker_config=registry.docker_config, owner=OWNER, harness_prefix="", retries=FAST)  # fmt: skip
    a, b = dep_images.names
    sandboxes = [factory(image=a), factory(image=a), factory(image=b)]
    try:
        _start_all(sandboxes)
        assert [_value(sb, m) for sb, m in zip(sandboxes, ("polar_dep_a", "polar_dep_a", "polar_dep_b"), strict=True)] == [
            "a", "a", "b"]  # fmt: skip
        assert dict(factory.pool.hosts[0].images.counts) == {"pull": 2}
    finally:
        for sb in sandboxes:
            sb.stop()
        factory.close()
        client.close()


def test_images_and_gc_commands(docker_engine, docker_image, capsys):
    """`sandbox images` makes a task set's images present (with sizes); `sandbox gc` would remove
    only per-task images that no given task set needs."""
    from polar_pl.cli import main
    from polar_pl.tasks.harbor import BUILTIN_DIR
    from polar_pl.tasks.sources import HarborTaskSource

    host = ["--docker-host", docker_engine.url]
    assert main(["sandbox", "images", "--tasks", str(BUILTIN_DIR), *host]) == 0
    out = capsys.readouterr().out
    assert "3/3 present" in out and "polar-pl/harbor-polar-word-count" in out
    assert main(["sandbox", "gc", "--tasks", str(BUILTIN_DIR), "--dry-run", *host]) == 0
    assert "would remove" not in capsys.readouterr().out.split("kept")[0].replace("polar-test", "")
    assert main(["sandbox", "gc", "--tasks", str(BUILTIN_DIR / "fix-mean"), "--dry-run", *host]) == 0
    listed = capsys.readouterr().out
    images = {t.instance_id: t.image for t in HarborTaskSource().tasks()}
    assert images["polar/hello-harbor"] in listed and images["polar/fix-mean"] not in listed


def test_remote_host_reaches_the_gateway_and_nothing_else(remote_docker_engine, docker_image, gateway_stub,
                                                          other_server):  # fmt: skip
    """On a remote host the container still has only `lo`; the gateway answers through the
    exec-stream relay, another server on this machine does not."""
    factory = DockerSandboxes(docker_hosts=[remote_docker_engine.host], owner=OWNER, harness_prefix="",
                              node="", retries=FAST)  # fmt: skip
    sb = factory()
    sb.start()
    try:
        assert sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split() == ["lo"]
        url = sb.expose_gateway(gateway_stub)
        probe = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
        many = [sb.exec(["python3", "-c", probe, f"{url}/ping"]).stdout.strip() for _ in range(3)]
        assert many == ["pong"] * 3
        res = sb.exec(["python3", "-c", probe, other_server + "/ping"])
        assert res.exit_code != 0 and "pong" not in res.stdout
    finally:
        sb.stop()
        factory.close()
