"""Rollout scale-out on a local multi-node Ray cluster: the real controller and workers
(`rollout=ray`: controller actor, `RayPools`, worker actors with their own stage pools) running
simulated stage costs, as bench/pipeline.py does, with 1 / 2 / 4 workers, against `rollout=local`
(the same `RolloutService` and `StagePools` in this process).

Each worker is one machine's worth of rollouts: its own pools and simulated engine slots, so the
ideal is N workers = N x the sessions per second of one. The load grows with the workers (weak
scaling: `--per-worker` sessions each), so start-up and drain weigh the same in every row.

Printed: sessions/s, scaling efficiency vs ideal (rate_N / (N x rate_1)), controller CPU per session
(the controller actor's process), Ray's wall time per session of one worker's stream vs
rollout=local with the same pools in this process, and
the targets (>= 90% efficiency from 1 to 4 workers; <= 5 ms controller CPU per session).

    python bench/scale.py                          # starts a 2-node cluster (sandbox: 2 each)
    python bench/scale.py --address HOST:PORT      # an existing cluster (nodes offering sandbox)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from polar_pl.rollout.pools import PoolSizes, RolloutJob, RolloutResult
from polar_pl.rollout.protocol import RolloutSetup
from polar_pl.rollout.service import RolloutService
from polar_pl.trajectory.rows import TrajectoryRow


class SimStages:
    """Sleeps per stage (the engine is each worker's own `running` slots); POSTRUN returns one row
    of `row_tokens` tokens, so rows cross the object store as real ones do."""

    def __init__(self, init_s: float, run_s: float, post_s: float, row_tokens: int) -> None:
        self.init_s, self.run_s, self.post_s, self.row_tokens = init_s, run_s, post_s, row_tokens

    async def init(self, job: RolloutJob) -> None:
        await asyncio.sleep(self.init_s)

    async def run(self, job: RolloutJob) -> None:
        await asyncio.sleep(self.run_s)

    async def postrun(self, job: RolloutJob) -> RolloutResult:
        await asyncio.sleep(self.post_s)
        n = self.row_tokens
        row = TrajectoryRow(list(range(n)), [0, 1] * (n // 2), [-0.5] * n, [0] * n, job.rollout_id,
                            job.rollout_id, job.group_id, reward=1.0)  # fmt: skip
        return RolloutResult(job.rollout_id, job.group_id, str(job.task), "ok", 1.0, rows=(row,))

    async def cleanup(self, job: RolloutJob) -> None:
        pass


@dataclass(frozen=True)
class SimFactory:
    init_s: float
    run_s: float
    post_s: float
    row_tokens: int

    def __call__(self, gateway) -> SimStages:
        return SimStages(self.init_s, self.run_s, self.post_s, self.row_tokens)


def make_setup(a, sessions: int) -> RolloutSetup:
    groups = sessions // a.group
    sizes = PoolSizes(init=a.slots, ready=a.slots, running=a.slots, postrun=a.slots, run_timeout_s=1e6)
    stages = SimFactory(a.init * a.scale, a.run * a.scale, a.post * a.scale, a.row_tokens)
    return RolloutSetup(stages, list(range(groups)), a.group, sizes, max_groups_in_flight=groups)


def run_local(a) -> tuple[float, float, int]:
    """(wall s, CPU s of this process, sessions) for one worker's pools in this process."""
    setup = make_setup(a, a.per_worker)
    svc = RolloutService(setup.stages(None), setup.tasks, **setup.service_kwargs())
    cpu0, t0 = time.process_time(), time.monotonic()
    svc.start()
    try:
        svc.next_groups(len(setup.tasks), timeout=1e6)
        return time.monotonic() - t0, time.process_time() - cpu0, a.per_worker
    finally:
        svc.stop()


def run_ray(a, address: str, workers: int) -> tuple[float, float, int, int]:
    """(wall s, controller CPU s, sessions, nodes used) with `workers` Ray workers."""
    from polar_pl.rollout.ray_backend import RayRollout

    sessions = a.per_worker * workers
    setup = make_setup(a, sessions)
    client = RayRollout(address, workers_per_node=a.workers_per_node, max_workers=workers,
                        poll_s=a.poll).connect(setup)  # fmt: skip
    try:
        nodes = len({w["node"] for w in client.workers})
        assert len(client.workers) == workers, f"asked for {workers} workers, got {len(client.workers)}"
        cpu0 = client.metrics()["rollout/controller_cpu_s"]
        t0 = time.monotonic()
        client.start_groups({})
        client.next_groups(len(setup.tasks), timeout=1e6)
        wall = time.monotonic() - t0
        cpu = client.metrics()["rollout/controller_cpu_s"] - cpu0
        return wall, cpu, sessions, nodes
    finally:
        client.close()


def start_cluster(nodes: int, sandbox: int):
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "resources": {"sandbox": sandbox}, "object_store_memory": 100 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    return cluster


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", default=None, help="an existing cluster; default: start one here")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--workers-per-node", type=int, default=2)
    ap.add_argument("--per-worker", type=int, default=96, help="sessions per worker (weak scaling)")
    ap.add_argument("--slots", type=int, default=8, help="engine slots and pool sizes per worker")
    ap.add_argument("--init", type=float, default=3.0)
    ap.add_argument("--run", type=float, default=6.0)
    ap.add_argument("--post", type=float, default=2.0)
    ap.add_argument("--scale", type=float, default=0.1, help="multiply every stage cost")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--row-tokens", type=int, default=2048)
    ap.add_argument("--poll", type=float, default=1.0, help="controller long-poll of each worker, s")
    a = ap.parse_args()
    import ray

    tmp = tempfile.mkdtemp(prefix="polar-ray-", dir="/tmp")
    os.environ.setdefault("RAY_TMPDIR", tmp)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = None if a.address else start_cluster(a.nodes, a.workers_per_node)
    address = a.address or cluster.address
    ray.init(address=address, log_to_driver=False)
    try:
        lw, lcpu, ls = run_local(a)
        rows = [(n, *run_ray(a, address, n)) for n in a.workers]
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(a, (lw, lcpu, ls), rows)


def print_table(a, local, rows) -> None:
    lw, lcpu, ls = local
    title = (f"INIT {a.init}s RUNNING {a.run}s POSTRUN {a.post}s (x{a.scale}), {a.slots} slots per worker, "
             f"{a.per_worker} sessions per worker, groups of {a.group}, rows of {a.row_tokens} tokens")  # fmt: skip
    table = Table(title=title)
    for col in ("rollout", "workers", "nodes", "sessions", "wall s", "sessions/s", "efficiency",
                "controller CPU ms/session", "wall ms/session vs local (per worker)"):  # fmt: skip
        table.add_column(col, justify="right")
    local_rate = ls / lw
    table.add_row("local", "1 (in-process)", "1", str(ls), f"{lw:.2f}", f"{local_rate:.1f}", "-",
                  f"{1e3 * lcpu / ls:.2f} (this process)", "-")  # fmt: skip
    base = None
    for n, wall, cpu, sessions, nodes in rows:
        rate = sessions / wall
        base = base or (rate / n if n == 1 else None)
        eff = f"{rate / (n * base):.1%}" if base else "-"
        extra = f"{1e3 * (wall * n / sessions - lw / ls):+.1f}"  # per session of one worker's stream
        table.add_row("ray", str(n), str(nodes), str(sessions), f"{wall:.2f}", f"{rate:.1f}", eff,
                      f"{1e3 * cpu / sessions:.2f}", extra)  # fmt: skip
    Console(width=170).print(table)
    print("targets: efficiency >= 90% from 1 to 4 workers; controller CPU <= 5 ms per session")


if __name__ == "__main__":
    main()
