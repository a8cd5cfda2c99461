"""A Harbor task whose Dockerfile is written as Docker users write them: build steps run as root
(RUN writes under WORKDIR, installs a Debian package), while the agent and the verifier still run
as the unprivileged sandbox user, chosen when the container starts, not baked into the image."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polar_pl.cli import main
from polar_pl.sandbox.docker import DockerSandbox
from polar_pl.tasks.harbor import load_harbor_task
from polar_pl.testing.hosts import debian_package
from polar_pl.testing.sandbox import OWNER

pytestmark = pytest.mark.slow

DOCKERFILE = """\
FROM polar-pl/sandbox:bookworm
COPY debs/ /tmp/debs/
RUN apt-get install -y --no-install-recommends /tmp/debs/*.deb && rm -rf /tmp/debs
WORKDIR /app
RUN printf 'print("TODO")\\n' > /app/greet.py && mkdir -p /app/data && echo seed > /app/data/seed.txt
"""
SOLVE = """\
#!/bin/bash
set -e
cd /app
echo "print($(hello | python3 -c 'import json, sys; print(json.dumps(sys.stdin.read().strip()))'))" > greet.py
id -u > agent-uid
"""
TEST = """\
#!/bin/bash
cd /app
if [ "$(python3 greet.py)" = "$(hello)" ] && [ "$(cat agent-uid)" = 1000 ] && [ "$(id -u)" = 1000 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def write_task(root: Path) -> Path:
    task = root / "greet"
    for d in ("environment/debs", "solution", "tests"):
        (task / d).mkdir(parents=True)
    shutil.copy(debian_package("hello"), task / "environment" / "debs")
    (task / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (task / "task.toml").write_text('[task]\nname = "polar/greet"\n')
    (task / "instruction.md").write_text("Make /app/greet.py print what the `hello` program prints.\n")
    (task / "solution" / "solve.sh").write_text(SOLVE)
    (task / "tests" / "test.sh").write_text(TEST)
    return task


def test_build_steps_run_as_root_and_the_agent_as_the_sandbox_user(
    docker_engine, docker_image, tmp_path, capsys
):
    """Such a task failed to build (`/bin/sh: cannot create /app/greet.py: Permission denied`):
    the base image ended with USER 1000:1000, so every RUN, apt-get install too, ran unprivileged."""
    task_dir = write_task(tmp_path)
    out = tmp_path / "check.json"
    code = main(["tasks", "check", "--source", "harbor", str(task_dir), "--sandbox", "docker",
                 "--docker-host", docker_engine.url, "--json", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    (check,) = json.loads(out.read_text())
    assert check["ok"] and check["solution"]["reward"] == 1.0 and check["empty"]["reward"] == 0.0, check

    task = load_harbor_task(task_dir)
    sb = DockerSandbox(image=task.image, image_context=task.image_context, docker_host=docker_engine.url,
                       owner=OWNER, harness_prefix="")  # fmt: skip
    sb.start()
    try:
        assert sb.workdir == "/app"
        assert sb.exec(["id", "-u"]).stdout.strip() == "1000"
        assert sb.exec(["grep", "CapEff", "/proc/self/status"]).stdout.split()[-1] == "0" * 16
        assert sb.exec(["hello"]).stdout.strip() == "Hello, world!"
        # root's build output is the agent's to change; what the build installed is not
        assert sb.exec(["sh", "-c", "echo x >> /app/greet.py && echo y > /app/data/new"]).exit_code == 0
        assert sb.exec(["sh", "-c", "echo x > /usr/bin/hello"]).exit_code != 0
        assert sb.exec(["dpkg", "--purge", "hello"]).exit_code != 0
    finally:
        sb.stop()
