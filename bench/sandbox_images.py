"""Per-task images at INIT: time-to-READY for many sessions over a few images, with and without
prefetch ahead of the task cursor (pull de-duplication on in both). Used by bench/sandbox.py.

The images (FROM the base image plus a wheel each) are pushed once to a local registry; before
each variant they are deleted from the engine, so every variant pulls. The stages are real
sandbox starts and stops on real stage pools fed by the real rollout service; RUNNING is a fixed
sleep standing in for the agent (what is measured is INIT's wait for images, not a harness).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from polar_pl.rollout.pools import PoolSizes, RolloutJob, RolloutResult
from polar_pl.rollout.service import RolloutService


@dataclass(frozen=True, slots=True)
class ImageTask:
    instance_id: str
    image: str
    image_context: str | None = None


class StartStopStages:
    """INIT starts a sandbox from the task's image; RUNNING sleeps `run_s`; POSTRUN stops it."""

    def __init__(self, factory, run_s: float, prefetch: bool) -> None:
        self.factory, self.run_s = factory, run_s
        self.prefetch_depth = factory.prefetch_tasks if prefetch else 0
        self.ready_at: dict[str, float] = {}

    def prefetch(self, tasks) -> None:
        self.factory.prefetch([(t.image, t.image_context) for t in tasks])

    async def init(self, job: RolloutJob) -> None:
        sb = self.factory(image=job.task.image)
        job.state["sandbox"] = sb
        await asyncio.to_thread(sb.start)
        self.ready_at[job.rollout_id] = time.monotonic() - job.timings["submitted"]

    async def run(self, job: RolloutJob) -> None:
        await asyncio.sleep(self.run_s)

    async def postrun(self, job: RolloutJob) -> RolloutResult:
        return RolloutResult(job.rollout_id, job.group_id, job.task.instance_id, job.status, 0.0)

    async def cleanup(self, job: RolloutJob) -> None:
        if (sb := job.state.pop("sandbox", None)) is not None:
            await asyncio.to_thread(sb.stop)


def push_images(engine_url: str, base: str, registry, n: int) -> list[str]:
    """Build n small per-task images and push them to `registry`; returns their names."""
    import docker

    from polar_pl.testing.hosts import dep_image_context, make_wheel

    client = docker.DockerClient(base_url=engine_url, timeout=600)
    names = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            wheel = make_wheel(Path(tmp) / "w", f"bench_dep_{i}", "1.0", f"VALUE = {i}\n")
            ctx = dep_image_context(Path(tmp) / f"ctx{i}", base, wheel)
            name = f"polar-bench/task-{i}:1"
            client.images.build(path=str(ctx), tag=name, network_mode="none", rm=True)
            client.images.get(name).tag(f"{registry.address}/polar-bench/task-{i}", "1")
            client.images.push(f"{registry.address}/polar-bench/task-{i}", "1", auth_config=registry.auth)
            names.append(name)
    client.close()
    return names


def _drop(engine_url: str, names: list[str], registry) -> None:
    import docker

    client = docker.DockerClient(base_url=engine_url)
    for name in names:
        for ref in (name, f"{registry.address}/{name}"):
            try:
                client.images.remove(ref, force=True)
            except docker.errors.ImageNotFound:
                pass
    client.close()


def bench_ready(make_factory, engine_url: str, names: list[str], registry, *, sessions: int = 32,
                group_size: int = 4, run_s: float = 1.0, prefetch: bool) -> dict[str, float]:  # fmt: skip
    """One variant: `sessions` sessions, groups cycling over the images."""
    _drop(engine_url, names, registry)
    factory = make_factory()
    tasks = [ImageTask(f"t{i}", name) for i, name in enumerate(names)]
    stages = StartStopStages(factory, run_s, prefetch)
    sizes = PoolSizes(init=4, ready=4, running=4, postrun=2, run_timeout_s=120)
    groups = sessions // group_size
    t0 = time.monotonic()
    service = RolloutService(stages, tasks, group_size=group_size, sizes=sizes, limit=groups,
                             max_groups_in_flight=2).start()  # fmt: skip
    try:
        service.next_groups(groups, timeout=900)
    finally:
        service.stop()
    wall = time.monotonic() - t0
    host = factory.pool.hosts[0]
    first_ready = min(e.done_at for e in host.images.events)
    late = sum(waited for t, waited, _ in host.images.waits if t >= first_ready)
    factory.close()
    ready = sorted(stages.ready_at.values())
    return {
        "wall_s": wall,
        "ready_p50_s": statistics.median(ready),
        "ready_max_s": ready[-1],
        "image_wait_s": host.images.wait_s,
        "wait_after_first_image_s": late,
        "pulls": host.images.counts["pull"],
    }
