"""A real two-node Ray cluster on this machine, shared by every rollout test (Ray start-up is the
expensive part), and a scripted engine factory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest
import rollout_kit
from fixture_paths import REPO
from rollout_kit import METRICS_TOKEN, NODE, SERVICE_TOKEN, SYSTEM_CONFIG, answer

from polar_pl.testing.scripted import ScriptedBackend, ScriptedServer
from polar_pl.utils.serving import free_port


@pytest.fixture(scope="session")
def ray_cluster():
    """Head + one more node, each offering `sandbox: 2`; this process is connected as a driver.
    Ray's files live in a private temp dir (other sessions share the machine)."""
    import ray
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(rollout_kit)  # its harness runs on the workers

    tmp = tempfile.mkdtemp(prefix="polar-ray-", dir="/tmp")  # short: Ray's socket paths have a limit
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", tmp)
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        cluster = Cluster(
            initialize_head=True,
            head_node_args={**NODE, "include_dashboard": False, "_system_config": SYSTEM_CONFIG},
        )
        try:
            cluster.add_node(**NODE)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def scripted_engine(tiny_model_dir):
    def make(token_delay: float = 0.0) -> ScriptedServer:
        return ScriptedServer(ScriptedBackend.from_model_dir(tiny_model_dir, answer, token_delay=token_delay))

    return make


@pytest.fixture(scope="session")
def service(tmp_path_factory, tiny_model_dir):
    """A real `polar-pl rollout serve` (mini harness, embedded engine, learnable tasks, groups of
    two), shared by test_http.py and test_remote.py: (an authorized httpx client, its run dir)."""
    port, run_dir = free_port(), tmp_path_factory.mktemp("rollout-serve")
    log = open(run_dir / "serve.log", "w+")
    cmd = [sys.executable, "-m", "polar_pl.cli", "rollout", "serve", "--port", str(port),
           "--run-dir", str(run_dir), "--metrics-token", METRICS_TOKEN, "experiment=tiny", "debug=fast",
           "datamodule.progress=false"]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "POLAR_ROLLOUT_TOKEN": SERVICE_TOKEN},
    )
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
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"service did not start:\n{log.read()[-4000:]}"
            )
            time.sleep(0.5)
        yield (
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {SERVICE_TOKEN}"}, timeout=120),
            run_dir,
        )
    finally:
        proc.send_signal(signal.SIGINT)  # teardown: sessions, sandboxes, gateway, engine
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
