"""`polar-pl tasks check --source harbor`: every built-in task's solution/solve.sh passes its
verifier in a fresh container and the empty attempt does not."""

from __future__ import annotations

import json

import pytest

from polar_pl.cli import main

pytestmark = pytest.mark.slow


def test_tasks_check_harbor(docker_engine, docker_image, tmp_path, capsys):
    out = tmp_path / "check.json"
    code = main(["tasks", "check", "--source", "harbor", "--sandbox", "docker", "--docker-host",
                 docker_engine.url, "--json", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().out
    checks = {c["instance_id"]: c for c in json.loads(out.read_text())}
    assert set(checks) == {"polar/hello-harbor", "polar/fix-mean", "polar/word-count"}
    assert all(c["ok"] and c["solution"]["reward"] == 1.0 for c in checks.values())
    assert {k: c["empty"]["reward"] for k, c in checks.items()} == {
        "polar/hello-harbor": 0.0, "polar/fix-mean": 0.0, "polar/word-count": 0.0}  # fmt: skip
    assert "3/3 tasks ok" in capsys.readouterr().out


def test_tasks_check_harbor_needs_docker(capsys):
    assert main(["tasks", "check", "--source", "harbor"]) == 2
    assert "--sandbox docker" in capsys.readouterr().out
