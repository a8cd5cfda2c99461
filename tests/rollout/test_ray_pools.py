"""RayPools on real Ray actors with simulated stages: a worker lost with no retries left masks its
sessions as infrastructure failures (no rows, never reward-0 training), the groups still come
complete, and losing the last worker fails the run with a clear error instead of hanging."""

from __future__ import annotations

import time

import pytest
import ray
from rollout_kit import sleep_stages

from polar_pl.rollout.pools import INFRA_FAILURE, OK, PoolSizes
from polar_pl.rollout.protocol import RolloutSetup
from polar_pl.rollout.ray_backend import RayRollout


@pytest.mark.slow
def test_lost_worker_without_retries_masks_its_sessions_and_losing_all_fails_clearly(ray_cluster):
    setup = RolloutSetup(sleep_stages(3.0), ["t0", "t1"], group_size=2,
                         sizes=PoolSizes(init=2, ready=2, running=2, postrun=2), max_groups_in_flight=2)  # fmt: skip
    client = RayRollout(ray_cluster.address, workers_per_node=1, max_retries=0, poll_s=0.5).connect(setup)
    try:
        assert len(client.workers) == 2
        client.start_groups({})
        deadline = time.monotonic() + 60
        while not all(w["jobs"] for w in client.worker_status()) and time.monotonic() < deadline:
            time.sleep(0.1)
        (first, second) = client.worker_status()
        held = first["jobs"]
        ray.kill(_actor(client, first["name"]), no_restart=True)
        groups = client.next_groups(2, timeout=60)
        results = [r for g in groups for r in g.results]
        masked = [r for r in results if r.status == INFRA_FAILURE]
        m = client.metrics()
        assert len(results) == 4 and all(g.complete for g in groups)
        assert len(masked) == held >= 1 and m["rollout/sessions_masked"] == held
        assert m["rollout/sessions_retried"] == 0 and m["rollout/workers_lost"] == 1
        assert all(not r.rows and "lost" in r.error and r.failed_stage == "infra" for r in masked)
        assert all(r.rows for r in results if r.status == OK)

        ray.kill(_actor(client, second["name"]), no_restart=True)
        with pytest.raises(RuntimeError, match="every rollout worker was lost"):
            for _ in range(3):  # groups it held come back masked first
                client.next_groups(1, timeout=60)
    finally:
        client.close()


def _actor(client, name: str):
    """The worker actor's handle, from the controller (which owns it)."""
    return ray.get(client.controller.worker_handle.remote(name))
