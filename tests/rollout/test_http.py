"""`polar-pl rollout serve` as a real process (mini harness, embedded engine, learnable tasks): the
60-line plain-PyTorch example trains through HTTP (groups in, weights pushed, versions advance),
and bad requests get 4xx answers with a message."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from fixture_paths import REPO
from rollout_kit import SERVICE_TOKEN as TOKEN

EXAMPLE = REPO / "examples" / "train_with_rollout_service.py"


@pytest.mark.slow
def test_plain_pytorch_example_trains_through_http(service, tiny_model_dir):
    api, _ = service
    before = api.get("/v1/policy_version").raise_for_status().json()["policy_version"]
    cmd = [sys.executable, str(EXAMPLE), "--url", str(api.base_url), "--token", TOKEN,
           "--model", str(tiny_model_dir), "--steps", "2"]  # fmt: skip
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("step ")]
    print("\n".join(lines))
    assert len(lines) == 2 and lines[-1].endswith(
        f"policy_version {before + 2}"
    )  # both pushes reached the engine
    stats = api.get("/v1/stats").raise_for_status().json()
    sessions = {k: v for k, v in stats.items() if k.startswith("pool/sessions_")}
    print(f"service sessions: {sessions}, gateway calls {stats.get('gateway/calls')}")
    assert sum(sessions.values()) >= 4  # two groups of two were served (and the next ones begun)
    assert set(api.get("/v1/state").json()) == {"start_seq", "skip_seqs"}


@pytest.mark.slow
def test_bad_requests_get_4xx_with_a_message(service):
    api, _ = service

    def error(resp: httpx.Response, status: int) -> str:
        assert resp.status_code == status, resp.text
        return resp.json()["error"]["message"]

    assert "bearer token" in error(httpx.get(f"{api.base_url}/v1/stats"), 401)
    assert "bearer token" in error(
        httpx.get(f"{api.base_url}/v1/stats", headers={"Authorization": "Bearer x"}), 401
    )
    assert "n:" in error(api.get("/v1/groups", params={"n": 0}), 422)
    assert "timeout:" in error(api.get("/v1/groups", params={"timeout": -1}), 422)
    assert "instance_id" in error(api.post("/v1/tasks", json={"tasks": [{"problem_statement": "x"}]}), 422)
    assert "tasks" in error(api.post("/v1/tasks", json={"tasks": []}), 422)
    row = {
        "instance_id": "t1",
        "problem_statement": "Say HELLO.",
        "answer_check": {"kind": "uppercase_fraction"},
    }
    assert "--feed queue" in error(api.post("/v1/tasks", json={"tasks": [row]}), 409)
    assert "not a directory" in error(api.post("/v1/weights", json={"path": "/nonexistent/weights"}), 400)
    assert "path" in error(api.post("/v1/weights", json={}), 422)
    assert "seqs" in error(api.post("/v1/groups/consumed", json={"seqs": []}), 422)
    assert "version" in error(api.post("/v1/policy_version", json={"version": -2}), 422)
    paths = api.get("/openapi.json").json()["paths"]
    assert {
        "/v1/tasks",
        "/v1/groups",
        "/v1/groups/stream",
        "/v1/weights",
        "/v1/policy_version",
        "/v1/stats",
    } <= set(paths)
