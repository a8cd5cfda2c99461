"""`GET /metrics` on the rollout service: stage-pool occupancy per stage, groups produced and
delivered, sessions by status, policy version, and its in-process gateway's metrics; no token
needed unless a metrics token is given (the service's bearer token does not open it)."""

from __future__ import annotations

import httpx
import pytest
from rollout_kit import METRICS_TOKEN, SERVICE_TOKEN, scripted_runtime

from polar_pl.rollout.http.app import create_app
from polar_pl.rollout.http.server import RolloutServer
from polar_pl.testing.metrics import scrape
from polar_pl.utils.serving import ServerThread

STAGES = {"init", "running", "postrun"}


@pytest.fixture
def rollout_server(scripted_engine, tmp_path):
    server = RolloutServer(scripted_runtime(scripted_engine(), tmp_path, max_groups_in_flight=4)).start()
    yield server
    server.stop()


def test_metrics_show_stage_occupancy_groups_and_version(rollout_server):
    """Nothing to scrape (issue 58): GET /metrics was a 404 on the rollout service."""
    with ServerThread(create_app(rollout_server, token=SERVICE_TOKEN)) as srv:
        auth = {"authorization": f"Bearer {SERVICE_TOKEN}"}
        got = httpx.get(f"{srv.url}/v1/groups", params={"n": 2, "timeout": 300}, headers=auth, timeout=330)
        assert got.status_code == 200, got.text
        m = scrape(srv.url)
    assert m.value("polar_rollout_groups_delivered_total") == 2
    assert m.value("polar_rollout_groups_produced_total") >= 2
    assert m.value("polar_rollout_sessions_total") >= 4
    assert m.labels("polar_rollout_stage_active", "stage") == STAGES
    assert m.labels("polar_rollout_stage_capacity", "stage") == STAGES
    assert m.value("polar_rollout_stage_capacity", stage="running") == 2
    assert m.value("polar_rollout_stage_busy_seconds_total", stage="running") > 0
    assert m.labels("polar_rollout_queue_length", "queue") == {"init", "ready", "postrun"}
    assert "polar_rollout_groups_ready" in m.families
    assert m.value("polar_rollout_policy_version") == 0
    # rollout=local: the service's own gateway (its port is local to this machine) is scraped too
    assert m.value("polar_gateway_calls_total", status="ok") >= 4


def test_metrics_token_when_given(rollout_server):
    with ServerThread(create_app(rollout_server, token=SERVICE_TOKEN, metrics_token="scrape-me")) as srv:
        assert httpx.get(f"{srv.url}/metrics").status_code == 401
        auth = {"authorization": f"Bearer {SERVICE_TOKEN}"}
        bad = httpx.get(f"{srv.url}/metrics", headers=auth)
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "auth_error"
        assert "polar_rollout_policy_version" in scrape(srv.url, token="scrape-me").families


@pytest.mark.slow
def test_rollout_serve_cli_metrics_token(service):
    """`polar-pl rollout serve --metrics-token` (the shared `service` fixture passes one)."""
    api, _ = service
    assert httpx.get(f"{api.base_url}/metrics").status_code == 401
    assert "polar_rollout_stage_active" in scrape(str(api.base_url), token=METRICS_TOKEN).families
