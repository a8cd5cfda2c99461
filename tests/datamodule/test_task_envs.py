"""Task environments end to end: the mini harness in each built-in Harbor task's own image through
the real gateway (scripted engine), on the local engine and on the remote TLS host; and the
infrastructure faults (registry down, a Dockerfile that fails to build, a host that disappears
mid-run): retried, then `infra_failure` with the right counts, masked, while the run goes on."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import docker
import pytest
import requests

from polar_pl.gateway.handle import Gateway
from polar_pl.harness.mini import Mini
from polar_pl.rollout.pools import INFRA_FAILURE, OK, PoolSizes
from polar_pl.rollout.service import RolloutService
from polar_pl.rollout.stages import HarnessRolloutStages, RolloutOptions
from polar_pl.sandbox.docker_factory import DockerSandboxes
from polar_pl.sandbox.hosts import DockerHost, HostSpec
from polar_pl.tasks.harbor import BUILTIN_DIR, load_harbor_task
from polar_pl.tasks.sources import HarborTaskSource
from polar_pl.testing.hosts import TcpForwarder
from polar_pl.testing.sandbox import OWNER
from polar_pl.testing.scripted import Reply, ToolCall, serve_scripted
from polar_pl.trajectory import PerRequestBuilder
from polar_pl.utils.serving import free_port

pytestmark = pytest.mark.slow
FAST = {"attempts": 2, "backoff_s": 0.2}
# a phrase of each built-in instruction -> the shell command that solves it (its solve.sh)
SOLUTIONS = {p: (BUILTIN_DIR / d / "solution" / "solve.sh").read_text() for p, d in
             (("greeting.txt", "hello-harbor"), ("stats.py", "fix-mean"), ("count.py", "word-count"))}  # fmt: skip


class Solver:
    """The scripted model: runs the task's solution as one bash call, then says it is done."""

    def __init__(self) -> None:
        self.prefix = ""  # prepended to the next `sleepers` solutions (to be mid-run at a fault)
        self.sleepers = 0

    def __call__(self, chat) -> Reply:
        msgs = chat.get("messages") or []
        if any(m.get("role") == "tool" for m in msgs):
            return Reply("Done.")
        text = " ".join(str(m.get("content")) for m in msgs if m.get("role") == "user")
        cmd = next((c for phrase, c in SOLUTIONS.items() if phrase in text), "true")
        if self.sleepers > 0:
            self.sleepers -= 1
            cmd = self.prefix + cmd
        return Reply(tool_calls=[ToolCall("bash", {"command": cmd})])


@pytest.fixture(scope="module")
def solver() -> Solver:
    return Solver()


@pytest.fixture(scope="module")
def gateway(tiny_model_dir, solver, tmp_path_factory):
    with serve_scripted(solver, model_dir=tiny_model_dir) as engine:
        store = tmp_path_factory.mktemp("gw") / "traces.db"
        with Gateway([engine.url], store, tokenizer_dir=tiny_model_dir, token_faithful=False) as gw:
            yield gw


def _run(gateway, factory, tasks, evaluator, *, groups: int, group_size: int):
    stages = HarnessRolloutStages(gateway, factory, Mini(max_turns=4), evaluator, PerRequestBuilder(),
                                  RolloutOptions(model="polar-tiny"))  # fmt: skip
    sizes = PoolSizes(init=2, ready=2, running=2, postrun=2, run_timeout_s=120)
    service = RolloutService(stages, tasks, group_size=group_size, sizes=sizes, limit=groups).start()
    try:
        out = service.next_groups(groups, timeout=420)
        return out, service.pools.infra.copy()
    finally:
        service.stop()
        evaluator.close()
        factory.close()


def test_harbor_tasks_end_to_end_and_image_faults(docker_engine, docker_image, gateway, tmp_path):
    """The three built-in tasks solved by the mini harness (reward file, exit status, reward.json),
    next to a task whose Dockerfile fails to build and one whose image is only in a registry that
    is down: those two are retried, then infra failures (masked: no rows), and the run goes on.
    The built-in images come from their Dockerfiles after the pull from that registry fails."""
    tasks = [
        _variant(tmp_path, "broken-build", dockerfile=f"FROM {docker_image}\nUSER root\nRUN exit 3\n"),
        _variant(tmp_path, "registry-down", image="polar-test/not-built-anywhere:1"),
        *HarborTaskSource().tasks(),
    ]
    factory = DockerSandboxes(docker_host=docker_engine.url, registry=f"127.0.0.1:{free_port()}",
                              owner=OWNER, harness_prefix="", retries=FAST)  # fmt: skip
    evaluator = HarborTaskSource().make_evaluator(factory)
    groups, infra = _run(gateway, factory, tasks, evaluator, groups=5, group_size=1)
    results = {g.task.instance_id: g.results[0] for g in groups}
    assert {k: (r.status, r.reward, bool(r.rows)) for k, r in results.items()} == {
        "polar/broken-build": (INFRA_FAILURE, 0.0, False),
        "polar/registry-down": (INFRA_FAILURE, 0.0, False),
        "polar/fix-mean": (OK, 1.0, True),
        "polar/hello-harbor": (OK, 1.0, True),
        "polar/word-count": (OK, 1.0, True),
    }
    assert infra == {"image": 2}
    assert "after 2 attempts" in results["polar/registry-down"].error
    assert "exit 3" in results["polar/broken-build"].error
    reasons = {k: r.info.eval_reason for k, r in results.items() if r.status == OK}
    assert reasons == {"polar/fix-mean": "reward 1 from exit status 0", "polar/hello-harbor": "reward 1 from reward file",
                       "polar/word-count": "reward 1 from reward file"}  # fmt: skip


def test_remote_tls_host_runs_a_harness_task_through_the_gateway(remote_docker_engine, gateway):
    """The image is built on the remote engine (its base imported there first), the tools come from
    a volume, and the harness reaches the gateway through the exec-stream relay."""
    source = HarborTaskSource(instance_ids=["polar/hello-harbor"])
    factory = DockerSandboxes(docker_hosts=[remote_docker_engine.host], owner=OWNER, harness_prefix="",
                              node="", retries=FAST)  # fmt: skip
    (group,), infra = _run(
        gateway, factory, source.tasks(), source.make_evaluator(factory), groups=1, group_size=1
    )
    (result,) = group.results
    assert (result.status, result.reward, result.info.calls) == (OK, 1.0, 2) and not infra


def _runs(client, owner: str, command: str) -> bool:
    """Whether a container of `owner` on that engine runs `command` now."""
    try:
        containers = client.containers.list(filters={"label": f"polar_pl.owner={owner}"})
    except requests.exceptions.RequestException:
        return False
    for c in containers:
        try:
            if any(command in " ".join(p) for p in c.top().get("Processes") or []):
                return True
        except (docker.errors.APIError, requests.exceptions.RequestException):  # gone meanwhile
            continue
    return False


def _variant(tmp: Path, name: str, dockerfile: str | None = None, image: str | None = None):
    d = tmp / name
    shutil.copytree(BUILTIN_DIR / "hello-harbor", d)
    toml = (d / "task.toml").read_text().replace("polar/hello-harbor", f"polar/{name}")
    if image:
        (d / "environment" / "Dockerfile").unlink()
        toml += f'docker_image = "{image}"\n'
    if dockerfile:
        (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "task.toml").write_text(toml)
    return load_harbor_task(d)


def test_host_that_disappears_mid_run(docker_engine, remote_docker_engine, gateway, solver):
    """Two hosts; the remote one (capacity 1, reached through a proxy) vanishes while its session's
    harness runs: that session is an infra failure, the other one and the next group finish."""
    forwarder = TcpForwarder("127.0.0.1", int(remote_docker_engine.url.rsplit(":", 1)[1]))
    remote = {**remote_docker_engine.host, "url": f"tcp://127.0.0.1:{forwarder.port}", "capacity": 1}
    factory = DockerSandboxes(docker_hosts=[remote, docker_engine.url], owner=f"disappear-{OWNER}",
                              harness_prefix="", node="", retries=FAST, health_interval_s=60)  # fmt: skip
    source = HarborTaskSource(instance_ids=["polar/hello-harbor"])
    # only a remote container has the tools volume: whatever the order, only its session sleeps
    solver.prefix, solver.sleepers = "[ -d /opt/polar/tools ] && sleep 4; ", 4

    direct = DockerHost(HostSpec.of(remote_docker_engine.host)).client()

    finished = threading.Event()

    def cut_when_the_remote_harness_runs() -> None:
        while not finished.wait(0.1):
            if _runs(direct, f"disappear-{OWNER}", "sleep 4"):
                forwarder.kill()
                return

    threading.Thread(target=cut_when_the_remote_harness_runs, daemon=True).start()
    try:
        groups, infra = _run(gateway, factory, source.tasks() * 2, source.make_evaluator(factory),
                             groups=2, group_size=2)  # fmt: skip
    finally:
        finished.set()
        solver.prefix = ""
        forwarder.kill()
        direct.close()
    statuses = [sorted(r.status for r in g.results) for g in groups]
    assert statuses == [[INFRA_FAILURE, OK], [OK, OK]]
    assert infra == {"exec": 1}
    assert all(r.reward == 1.0 for g in groups for r in g.results if r.status == OK)
