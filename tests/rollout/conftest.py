"""A real two-node Ray cluster on this machine, shared by every rollout test (Ray start-up is the
expensive part), and a scripted engine factory."""

from __future__ import annotations

import shutil
import tempfile

import pytest
import rollout_kit
from rollout_kit import NODE, SYSTEM_CONFIG, answer

from polar_pl.testing.scripted import ScriptedBackend, ScriptedServer


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
