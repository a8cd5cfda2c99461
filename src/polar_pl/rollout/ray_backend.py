"""`rollout=ray`: connect to a Ray cluster, start the controller actor (which starts the workers),
and drive it from the trainer's process through `RayClient`.

address: `auto` (the cluster this machine belongs to, as `ray start` left it), `host:port` or
`ray://host:10001` (Ray Client), or `local` to start a one-node Ray inside this process whose node
offers `sandbox: workers_per_node`. See docs/cluster.md for Slurm and KubeRay.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from polar_pl.gateway.call.gate import PauseMode
from polar_pl.rollout.protocol import RolloutSetup
from polar_pl.rollout.service import Group

log = logging.getLogger(__name__)
HEAD = "node:__internal_head__"  # the resource Ray gives the head node only


class RayRollout:
    """The `rollout=ray` backend (conf/rollout/ray.yaml).

    workers_per_node: rollout workers on each node offering `sandbox` (each takes one unit).
    max_workers: at most this many workers in all, spread round-robin over the nodes (None: no cap).
    max_retries: times a session lost with its worker is run again elsewhere before it is masked.
    init_kwargs: extra `ray.init` arguments (address=local: num_cpus, object_store_memory, ...).
    """

    def __init__(
        self,
        address: str = "local",
        *,
        workers_per_node: int = 1,
        max_workers: int | None = None,
        max_retries: int = 2,
        namespace: str | None = None,
        poll_s: float = 1.0,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"rollout.max_retries={max_retries}: must be >= 0")
        self.address, self.workers_per_node, self.max_retries = address, workers_per_node, max_retries
        self.max_workers = max_workers
        self.namespace, self.poll_s, self.init_kwargs = namespace, poll_s, dict(init_kwargs or {})

    def engine(self) -> None:
        return None  # the `engine` group's

    def connect(self, setup: RolloutSetup) -> RayClient:
        import ray

        from polar_pl.rollout.ray_controller import RolloutController

        owns = self._init(ray)
        try:
            controller = (
                ray.remote(RolloutController)
                .options(
                    num_cpus=0,
                    # on the head, whose loss ends the cluster anyway: never on a rollout node that may die
                    resources={HEAD: 0.001},
                    max_concurrency=16,
                    max_restarts=0,
                )
                .remote(
                    setup,
                    workers_per_node=self.workers_per_node,
                    max_workers=self.max_workers,
                    max_retries=self.max_retries,
                    poll_s=self.poll_s,
                )
            )
            workers = ray.get(controller.workers.remote())  # type: ignore[attr-defined]  # raises if a worker failed
        except BaseException:
            if owns:
                ray.shutdown()
            raise
        log.info("rollout=ray: %d workers on %d nodes", len(workers), len({w["node"] for w in workers}))
        return RayClient(controller, workers, owns_ray=owns)

    def _init(self, ray) -> bool:
        """ray.init unless this process is connected already; True when this call connected."""
        if ray.is_initialized():
            return False
        kwargs: dict[str, Any] = {"namespace": self.namespace, "log_to_driver": True, **self.init_kwargs}
        if self.address == "local":  # a new instance, never another cluster found on this machine
            kwargs.setdefault("resources", {"sandbox": self.workers_per_node})
            kwargs.setdefault("include_dashboard", False)
        kwargs["address"] = self.address
        ray.init(**kwargs)
        return True


class RayClient:
    """`RolloutClient` over the controller actor. `workers` lists where the workers run (name,
    node, host, pid, trace store)."""

    gateway = None  # one per worker, on its node
    health = None  # the controller watches its workers

    def __init__(self, controller: Any, workers: list[dict[str, Any]], *, owns_ray: bool) -> None:
        self.controller, self.workers, self._owns_ray = controller, workers, owns_ray

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        import ray

        return ray.get(getattr(self.controller, method).remote(*args), timeout=timeout)

    def start_groups(self, cursor: dict[str, Any]) -> None:
        self._call("start_groups", cursor)

    def next_groups(self, n: int, timeout: float | None = None, *, consume: bool = True) -> list[Group]:
        return self._call("next_groups", n, timeout, consume)

    def mark_consumed(self, seqs: Sequence[int]) -> None:
        self._call("mark_consumed", list(seqs))

    def submit_tasks(self, tasks: Sequence[Any]) -> list[int]:
        return self._call("submit_tasks", list(tasks))

    def state_dict(self) -> dict[str, Any]:
        return self._call("state_dict")

    def metrics(self) -> dict[str, float]:
        return self._call("metrics", timeout=30)

    def last_failure(self) -> str | None:
        return self._call("last_failure", timeout=30)

    def records(self, worker: str, session_id: str) -> list[Any]:
        """A session's raw trace records, from the store of the worker's gateway that served it."""
        return self._call("records", worker, session_id)

    def worker_status(self) -> list[dict[str, Any]]:
        return self._call("workers")

    def pause(self, mode: PauseMode) -> None:
        self._call("pause", mode)

    def resume(self) -> None:
        self._call("resume")

    def set_policy_version(self, version: int) -> None:
        self._call("set_policy_version", int(version))

    def take_out_engine(self, url: str) -> None:
        self._call("take_out_engine", url)

    def stop_feeding(self) -> None:
        if self.controller is not None:
            self.controller.stop_feeding.remote()  # not awaited: a signal handler calls this

    def close(self, timeout: float = 60.0) -> None:
        import ray

        if self.controller is None:
            return
        try:
            self._call("close", timeout, timeout=timeout + 60)
        except Exception:  # a dead controller must not stop the teardown
            log.exception("rollout=ray: controller close failed")
        finally:
            ray.kill(self.controller, no_restart=True)
            self.controller = None
            if self._owns_ray:
                ray.shutdown()
