"""The rollout service's group delivery and weight pushes over real HTTP: an in-process
`RolloutServer` fed by a task queue (the tiny model's embedded engine, a one-call harness, local
sandboxes) behind uvicorn on 127.0.0.1, read with httpx. A reader that leaves loses no group, idle
streams hold no worker thread, open streams are bounded, and a weight push that fails changes
nothing (issue 58)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import torch
from rollout_kit import SERVICE_TOKEN, scripted_runtime

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.weights import save_state_dict
from polar_pl.rollout.http.app import create_app
from polar_pl.rollout.http.server import RolloutServer, feed_tasks
from polar_pl.tasks.learnable import LearnableTaskSource
from polar_pl.utils.serving import ServerThread

MAX_STREAMS = 50
AUTH = {"Authorization": f"Bearer {SERVICE_TOKEN}"}
PROMPT = list(range(300, 330))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def queue_service(tiny_model_dir, tmp_path_factory) -> Iterator[tuple[RolloutServer, httpx.Client]]:
    """(the server, an authorized client of its HTTP API). Groups exist only for submitted tasks."""
    engine = EmbeddedEngine(tiny_model_dir, served_model_name="tiny", num_threads=1, max_model_len=512)
    runtime = scripted_runtime(engine, tmp_path_factory.mktemp("delivery"), task_feed=feed_tasks("queue"),
                               max_groups_in_flight=4)  # fmt: skip
    server = RolloutServer(runtime).start()
    try:
        app = create_app(server, token=SERVICE_TOKEN, max_streams=MAX_STREAMS)
        with ServerThread(app) as srv, httpx.Client(base_url=srv.url, headers=AUTH, timeout=120) as api:
            yield server, api
    finally:
        server.stop()


def submit(server: RolloutServer, n: int) -> list[int]:
    task = LearnableTaskSource(n_tasks=1).tasks()[0]
    return server.client.submit_tasks([task] * n)


def wait_until(what: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "the service did not get there"
        time.sleep(0.2)


def released(api: httpx.Client, seqs: list[int]) -> Callable[[], bool]:
    """All of `seqs` are finished: waiting to be read, or taken (consumed) by some reader."""

    def check() -> bool:
        stats = api.get("/v1/stats").raise_for_status().json()
        state = api.get("/v1/state").raise_for_status().json()
        taken = sum(s < state["start_seq"] or s in state["skip_seqs"] for s in seqs)
        waiting = stats.get("pool/groups_ready", 0) + stats.get("http/groups_held", 0)
        return taken + waiting >= len(seqs)

    return check


def test_a_stream_reader_that_leaves_loses_no_group(queue_service):
    """The failure: a reader of /v1/groups/stream took one group and closed the connection; the
    stream, still waiting, consumed the next group and wrote it to nobody, so the next reader of
    GET /v1/groups got seqs 3, 4, 5 and group 2 was never delivered."""
    server, api = queue_service
    (first,) = submit(server, 1)
    with api.stream("GET", "/v1/groups/stream") as stream:
        assert stream.status_code == 200
        assert json.loads(next(stream.iter_lines()))["seq"] == first
    later = submit(server, 3)
    wait_until(released(api, later))
    r = api.get("/v1/groups", params={"n": 3, "timeout": 30})
    assert r.status_code == 200, r.text
    assert [g["seq"] for g in r.json()["groups"]] == later


def test_a_long_poll_reader_that_leaves_loses_no_group(queue_service):
    """The failure: a GET /v1/groups whose client gave up (its read timeout) went on waiting,
    consumed the next group and answered a closed connection: that group was never delivered."""
    server, api = queue_service
    with pytest.raises(httpx.ReadTimeout):
        api.get("/v1/groups", params={"n": 1, "timeout": 600}, timeout=1.0)
    seqs = submit(server, 1)
    wait_until(released(api, seqs))
    r = api.get("/v1/groups", params={"n": 1, "timeout": 30})
    assert r.status_code == 200, r.text
    assert [g["seq"] for g in r.json()["groups"]] == seqs


@contextlib.contextmanager
def open_streams(url: str, n: int) -> Iterator[list[httpx.Response]]:
    """n streams, each open (its 200 and headers read) and waiting for a group."""
    with httpx.Client(
        base_url=url, headers=AUTH, timeout=30, limits=httpx.Limits(max_connections=n + 8)
    ) as c:
        streams: list[httpx.Response] = []
        try:
            for _ in range(n):
                streams.append(c.send(c.build_request("GET", "/v1/groups/stream"), stream=True))
            yield streams
        finally:
            for s in streams:
                s.close()


def test_idle_streams_do_not_starve_the_service(queue_service):
    """The failure: each open stream held a worker thread while it waited for a group; with 48 of
    them open, the 41st got no answer and GET /health none within 20 s."""
    _, api = queue_service
    with open_streams(str(api.base_url), 48) as streams:
        assert [s.status_code for s in streams] == [200] * 48
        assert httpx.get(f"{api.base_url}/health", timeout=10).json() == {"status": "ok"}
        assert api.get("/v1/stats", timeout=10).json()["http/streams_open"] == 48
    wait_until(lambda: api.get("/v1/stats").json()["http/streams_open"] == 0, timeout=60)


def test_streams_past_the_bound_are_refused_in_the_error_shape(queue_service):
    """The failure: nothing bounded the open streams (each one a thread, then a socket and a
    waiter); one past `max_streams` must get a 429 that says so, and a closed one frees its slot."""
    _, api = queue_service
    with open_streams(str(api.base_url), MAX_STREAMS) as streams:
        over = api.get("/v1/groups/stream")
        assert over.status_code == 429, over.text
        error = over.json()["error"]
        assert error["type"] == "rate_limit_error" and f"{MAX_STREAMS} streams" in error["message"]
        streams.pop().close()
        wait_until(lambda: api.get("/v1/stats").json()["http/streams_open"] < MAX_STREAMS, timeout=60)
        with api.stream("GET", "/v1/groups/stream") as again:
            assert again.status_code == 200
    wait_until(lambda: api.get("/v1/stats").json()["http/streams_open"] == 0, timeout=60)


def greedy(engine: EmbeddedEngine) -> list[float]:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0,
            "ignore_eos": True}  # fmt: skip
    r = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["token_logprobs"]


def test_a_weight_push_with_one_wrong_tensor_changes_nothing(queue_service, tmp_path):
    """The failure: POST /v1/weights with every tensor valid (moved) but the last of the wrong
    shape answered an error after the engine had copied the others: greedy logprobs moved while
    the policy version stayed, so later records named a version whose weights no longer existed."""
    server, api = queue_service
    engine = server.runtime.engine
    before, version = greedy(engine), api.get("/v1/policy_version").json()["policy_version"]
    torch.manual_seed(0)
    weights = {k: v + 0.05 * torch.randn_like(v) for k, v in engine.backend.model.state_dict().items()}
    weights["model.norm.weight"] = torch.zeros(3, 3)
    save_state_dict(weights, tmp_path)
    r = api.post("/v1/weights", json={"path": str(tmp_path)})
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "model.norm.weight" in r.json()["error"]["message"]
    assert api.get("/v1/policy_version").json()["policy_version"] == version
    after = greedy(engine)
    assert max(abs(a - b) for a, b in zip(after, before, strict=True)) < 1e-6
