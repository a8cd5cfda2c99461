"""`polar-pl rollout serve` as a real process (mini harness, embedded engine, learnable tasks): the
60-line plain-PyTorch example trains through HTTP (groups in, weights pushed, versions advance),
and bad requests get 4xx answers with a message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from polar_pl.utils.serving import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_with_rollout_service.py"
TOKEN = "test-token-0"


@pytest.fixture(scope="module")
def service(tmp_path_factory, tiny_model_dir):
    port, run_dir = free_port(), tmp_path_factory.mktemp("rollout-serve")
    log = open(run_dir / "serve.log", "w+")  # noqa: SIM115 — read back on failure
    cmd = [sys.executable, "-m", "polar_pl.cli", "rollout", "serve", "--port", str(port), "--token", TOKEN,
           "--run-dir", str(run_dir), "debug=fast", "datamodule.progress=false"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            log.seek(0)
            assert proc.poll() is None and time.monotonic() < deadline, f"service did not start:\n{log.read()[-4000:]}"
            time.sleep(0.5)
        yield httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120), run_dir
    finally:
        proc.send_signal(signal.SIGINT)  # teardown: sessions, sandboxes, gateway, engine
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.slow
def test_plain_pytorch_example_trains_through_http(service, tiny_model_dir):
    api, _ = service
    cmd = [sys.executable, str(EXAMPLE), "--url", str(api.base_url), "--token", TOKEN,
           "--model", str(tiny_model_dir), "--steps", "2"]  # fmt: skip
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("step ")]
    print("\n".join(lines))
    assert len(lines) == 2 and lines[-1].endswith("policy_version 2")  # both pushes reached the engine
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
    assert "bearer token" in error(httpx.get(f"{api.base_url}/v1/stats", headers={"Authorization": "Bearer x"}), 401)
    assert "n:" in error(api.get("/v1/groups", params={"n": 0}), 422)
    assert "timeout:" in error(api.get("/v1/groups", params={"timeout": -1}), 422)
    assert "instance_id" in error(api.post("/v1/tasks", json={"tasks": [{"problem_statement": "x"}]}), 422)
    assert "tasks" in error(api.post("/v1/tasks", json={"tasks": []}), 422)
    row = {"instance_id": "t1", "problem_statement": "Say HELLO.", "answer_check": {"kind": "uppercase_fraction"}}
    assert "--feed queue" in error(api.post("/v1/tasks", json={"tasks": [row]}), 409)
    assert "not a directory" in error(api.post("/v1/weights", json={"path": "/nonexistent/weights"}), 400)
    assert "path" in error(api.post("/v1/weights", json={}), 422)
    assert "seqs" in error(api.post("/v1/groups/consumed", json={"seqs": []}), 422)
    assert "version" in error(api.post("/v1/policy_version", json={"version": -2}), 422)
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/v1/tasks", "/v1/groups", "/v1/groups/stream", "/v1/weights", "/v1/policy_version", "/v1/stats"} <= set(paths)
