"""The rollout controller as a Ray actor: starts the workers (`workers_per_node` on each live node
offering the `sandbox` resource, pinned to it), then runs `RolloutService` over them (`RayPools`):
task feed, group bookkeeping, deadlines, work-ahead bound, resume cursor, as in-process.

A threaded actor: `next_groups` blocks in one thread while `metrics` or a weight-push pause are
served from others. Groups (with their rows) return to the caller through the object store.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from polar_pl.gateway.call.gate import PauseMode
from polar_pl.rollout.local import ServiceCalls
from polar_pl.rollout.protocol import RolloutSetup
from polar_pl.rollout.ray_pools import RayPools, WorkerSlot
from polar_pl.rollout.ray_worker import RolloutWorker
from polar_pl.rollout.service import RolloutService

log = logging.getLogger(__name__)
SANDBOX = "sandbox"  # the custom resource a node advertises per rollout worker it can host


def sandbox_nodes() -> list[dict[str, Any]]:
    """Live nodes that offer the `sandbox` resource, in a stable order."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(SANDBOX, 0) >= 1]
    return sorted(nodes, key=lambda n: n["NodeID"])


def start_workers(
    setup: RolloutSetup, workers_per_node: int, max_workers: int | None = None
) -> list[WorkerSlot]:
    """One worker actor per `sandbox` unit, at most `workers_per_node` per node and `max_workers`
    in all (taken round-robin over the nodes); each started (gateway up, pools running) before
    this returns."""
    if workers_per_node < 1:
        raise ValueError(f"rollout.workers_per_node={workers_per_node}: must be >= 1")
    places = sorted(
        ((j, node["NodeID"]) for node in sandbox_nodes()
         for j in range(min(workers_per_node, int(node["Resources"][SANDBOX])))),
    )[:max_workers]  # fmt: skip
    if not places:
        raise RuntimeError(
            "rollout=ray: no live node offers the `sandbox` resource "
            "(start nodes with --resources '{\"sandbox\": N}', see docs/cluster.md)"
        )
    actor_cls = ray.remote(RolloutWorker)
    actors = [
        actor_cls.options(
            num_cpus=0,
            resources={SANDBOX: 1},
            max_restarts=0,  # a lost worker's jobs are retried elsewhere, never twice
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote(f"{node[:8]}-w{i}", setup)
        for i, (_, node) in enumerate(places)
    ]
    infos = ray.get([a.start.remote() for a in actors])  # type: ignore[attr-defined]  # actor handles
    s = setup.sizes
    capacity = s.init + s.ready + s.running + s.postrun
    return [
        WorkerSlot(i, info["name"], a, info["node"], capacity, info=info)
        for i, (a, info) in enumerate(zip(actors, infos, strict=True))
    ]


class RolloutController(ServiceCalls):
    """See module docstring (made an actor by `RayRollout.connect`)."""

    owner = "rollout controller"

    def __init__(self, setup: RolloutSetup, *, workers_per_node: int = 1, max_workers: int | None = None,
                 max_retries: int = 2, poll_s: float = 1.0) -> None:  # fmt: skip
        self.setup, self.max_retries, self.poll_s = setup, max_retries, poll_s
        self.slots = start_workers(setup, workers_per_node, max_workers)
        self.service: RolloutService | None = None
        log.info("rollout controller: %d workers on %d nodes", len(self.slots),
                 len({w.node for w in self.slots}))  # fmt: skip

    def workers(self) -> list[dict[str, Any]]:
        """Name, node, host, pid and trace store of every worker, whether it is alive and how many
        jobs it holds now."""
        return [{**w.info, "alive": w.alive, "jobs": len(w.jobs)} for w in self.slots]

    def node(self) -> str:
        """The node this controller runs on."""
        return ray.get_runtime_context().get_node_id()

    def worker_handle(self, name: str) -> Any:
        """The actor handle of one worker (operators and fault tests kill workers by name)."""
        (slot,) = [w for w in self.slots if w.name == name]
        return slot.actor

    def start_groups(self, cursor: dict[str, Any]) -> None:
        if self.service is None:
            pools = RayPools(self.slots, max_retries=self.max_retries, poll_s=self.poll_s)
            self.service = RolloutService(
                None, self.setup.tasks, **self.setup.service_kwargs(), **cursor, pools=lambda: pools
            ).start()

    def metrics(self) -> dict[str, float]:
        m = self.service.metrics() if self.service is not None else {}
        m["rollout/controller_cpu_s"] = time.process_time()  # this actor's process, all threads
        return m

    def records(self, worker: str, session_id: str) -> list[Any]:
        (slot,) = [w for w in self.slots if w.name == worker]
        return ray.get(slot.actor.records.remote(session_id))

    def pause(self, mode: PauseMode) -> None:
        self._on_live_workers("pause", mode)

    def resume(self) -> None:
        self._on_live_workers("resume")

    def set_policy_version(self, version: int) -> None:
        self._on_live_workers("set_policy_version", version)

    def take_out_engine(self, url: str) -> None:
        self._on_live_workers("take_out_engine", url)

    def stop_feeding(self) -> None:
        if self.service is not None:
            self.service.stop_feeding()

    def close(self, timeout: float = 60.0) -> None:
        """Pools stopped, then every worker cleans up its sessions and sandboxes and exits."""
        if self.service is not None:
            self.service.stop(timeout)
            self.service = None
        self._on_live_workers("stop", timeout=timeout)
        for w in self.slots:
            ray.kill(w.actor, no_restart=True)

    def _on_live_workers(self, method: str, *args: Any, timeout: float = 600.0) -> None:
        """Call a method on every live worker at once; a worker that dies meanwhile is left to the
        pools (its jobs are retried there)."""
        live = [w for w in self.slots if w.alive]
        refs = [getattr(w.actor, method).remote(*args) for w in live]
        for w, ref in zip(live, refs, strict=True):
            try:
                ray.get(ref, timeout=timeout)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                log.warning("rollout worker %s: %s failed: %s", w.name, method, type(exc).__name__)
