"""`RayPools`: what `RolloutService` drives in place of its in-process `StagePools` when rollouts run
on Ray workers. Same surface (`start`, `submit`, `results`, `metrics`, `stop`), so the group
bookkeeping (G attempts, deadlines, work-ahead bound, resume cursor) is the service's, unchanged.

Placement: a job goes to the live worker holding the smallest share of its capacity (every stage
slot plus the READY buffer); when all are full, `submit` waits (backpressure to the feeder).
Jobs placed in one burst (a group's G attempts) travel to a worker in one call, and a worker's
poll answer carries every result finished within `LINGER_S` of the first: actor calls, not
sessions, are what the controller's CPU pays for.

Faults: a worker whose actor died (its process, raylet or node) has its in-flight jobs sent again
to other workers, up to `max_retries` times per job; then the job is published as an
`infra_failure` result with no rows (masked, never trained as reward 0). Each result is delivered
at most once: one from a worker the job no longer belongs to is dropped and counted. With no
worker left the service fails (the trainer's `next_groups` raises).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError

from polar_pl.rollout.outcome import INFRA
from polar_pl.rollout.pools import INFRA_FAILURE, AttemptInfo, RolloutJob, RolloutResult

log = logging.getLogger(__name__)
LINGER_S = 0.05


@dataclass(slots=True)
class WorkerSlot:
    """The controller's view of one worker actor."""

    index: int
    name: str
    actor: Any
    node: str
    capacity: int
    alive: bool = True
    jobs: set[str] = field(default_factory=set)
    info: dict[str, Any] = field(default_factory=dict)  # what the worker's start() reported
    outbox: list[RolloutJob] = field(default_factory=list)  # placed, not yet sent
    sending: bool = False


@dataclass(slots=True)
class _Tracked:
    job: RolloutJob
    worker: int
    attempt: int  # 0 = first try


class _Results(asyncio.Queue):
    """A results queue that raises, in the consumer, the error that stopped the pools."""

    _FAILED = object()

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.put_nowait(self._FAILED)

    async def get(self) -> RolloutResult:
        item = await super().get()
        if item is self._FAILED:
            raise self.error
        return item


class RayPools:
    """See module docstring. workers: started worker actors (`ray_controller.start_workers`)."""

    def __init__(self, workers: list[WorkerSlot], *, max_retries: int = 2, poll_s: float = 1.0) -> None:
        if not workers:
            raise ValueError("rollout=ray: no rollout worker (no live node offers the `sandbox` resource)")
        self.workers, self.max_retries, self.poll_s = workers, max_retries, poll_s
        self.results: _Results = _Results()
        self.counters: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self._jobs: dict[str, _Tracked] = {}
        self._room = asyncio.Condition()
        self._tasks: set[asyncio.Task] = set()
        self._worker_metrics: dict[int, dict[str, float]] = {}

    # ---- the StagePools surface -----------------------------------------------------------
    def start(self) -> None:
        for w in self.workers:
            self._spawn(self._pump(w))
        self._spawn(self._watch_metrics())

    async def submit(self, job: RolloutJob) -> None:
        job.timings["submitted"] = time.monotonic()
        self._enqueue(await self._place(), job, attempt=0)

    def metrics(self) -> dict[str, float]:
        m = merge_metrics(
            [self._worker_metrics[w.index] for w in self.workers if w.index in self._worker_metrics]
        )
        for status, n in self.statuses.items():
            m[f"pool/sessions_{status}"] = float(n)  # counted here: a dead worker's counts live on
        alive = [w for w in self.workers if w.alive]
        m["rollout/workers"] = float(len(self.workers))
        m["rollout/workers_alive"] = float(len(alive))
        m["rollout/nodes_alive"] = float(len({w.node for w in alive}))
        m["rollout/jobs_in_flight"] = float(len(self._jobs))
        for k in ("workers_lost", "sessions_retried", "sessions_masked", "results_dropped"):
            m[f"rollout/{k}"] = float(self.counters[k])
        return m

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- placement and delivery -----------------------------------------------------------
    async def _place(self) -> WorkerSlot:
        async with self._room:
            while True:
                live = [w for w in self.workers if w.alive]
                if not live:
                    raise RuntimeError("rollout=ray: every rollout worker was lost")
                free = [w for w in live if len(w.jobs) < w.capacity]
                if free:
                    return min(free, key=lambda w: (len(w.jobs) / w.capacity, w.index))
                await self._room.wait()

    def _enqueue(self, w: WorkerSlot, job: RolloutJob, attempt: int) -> None:
        self._jobs[job.rollout_id] = _Tracked(job, w.index, attempt)
        w.jobs.add(job.rollout_id)
        w.outbox.append(job)
        if not w.sending:
            w.sending = True
            self._spawn(self._send(w))

    async def _send(self, w: WorkerSlot) -> None:
        try:
            while w.outbox and w.alive:
                batch, w.outbox = w.outbox, []
                try:
                    await w.actor.submit.remote(batch)
                except ActorUnavailableError:
                    # Maybe delivered, maybe not: place them again. Should a first copy finish too,
                    # its result comes from a worker the job no longer belongs to and is dropped.
                    for job in batch:
                        w.jobs.discard(job.rollout_id)
                        self._spawn(self._place_again(job, self._jobs[job.rollout_id].attempt))
                except RayActorError as exc:
                    await self._lost(w, exc)
        finally:
            w.sending = False

    async def _place_again(self, job: RolloutJob, attempt: int) -> None:
        await asyncio.sleep(self.poll_s)
        self._enqueue(await self._place(), job, attempt)

    async def _pump(self, w: WorkerSlot) -> None:
        while w.alive:
            try:
                results = await w.actor.poll.remote(self.poll_s, LINGER_S)
            except ActorUnavailableError:
                await asyncio.sleep(self.poll_s)  # unreachable for now; dead only when Ray says so
                continue
            except RayActorError as exc:
                await self._lost(w, exc)
                return
            for r in results:
                self._deliver(w, r)
            if results:
                async with self._room:
                    self._room.notify_all()

    def _deliver(self, w: WorkerSlot, r: RolloutResult) -> None:
        w.jobs.discard(r.rollout_id)
        t = self._jobs.get(r.rollout_id)
        if t is None or t.worker != w.index:
            self.counters["results_dropped"] += 1  # the job was given to another worker meanwhile
            return
        del self._jobs[r.rollout_id]
        self._publish(replace(r, info=replace(r.info, worker=w.name, node=w.node, attempt=t.attempt)))

    def _publish(self, r: RolloutResult) -> None:
        self.statuses[r.status] += 1
        self.results.put_nowait(r)

    # ---- faults ---------------------------------------------------------------------------
    async def _lost(self, w: WorkerSlot, exc: BaseException) -> None:
        if not w.alive:
            return
        w.alive = False
        self.counters["workers_lost"] += 1
        why = f"rollout worker {w.name} (node {w.node[:12]}) lost: {type(exc).__name__}"
        log.warning("%s; %d sessions in flight on it", why, len(w.jobs))
        any_left = any(x.alive for x in self.workers)
        for rid in sorted(w.jobs):
            t = self._jobs.pop(rid, None)
            if t is None:
                continue
            if t.attempt < self.max_retries and any_left:
                self.counters["sessions_retried"] += 1
                self._spawn(self._retry(t))
            else:
                self._mask(t, why)
        w.jobs.clear()
        w.outbox.clear()
        self._worker_metrics.pop(w.index, None)
        async with self._room:
            self._room.notify_all()
        if not any_left:
            self.results.fail(RuntimeError(f"rollout=ray: every rollout worker was lost (last: {why})"))

    async def _retry(self, t: _Tracked) -> None:
        fresh = RolloutJob(t.job.rollout_id, t.job.group_id, t.job.task, member=t.job.member)
        try:
            w = await self._place()
        except RuntimeError as exc:
            self._mask(t, str(exc))
            return
        self._enqueue(w, fresh, t.attempt + 1)

    def _mask(self, t: _Tracked, why: str) -> None:
        self.counters["sessions_masked"] += 1
        job = t.job
        self._publish(
            RolloutResult(
                rollout_id=job.rollout_id,
                group_id=job.group_id,
                task_id=str(getattr(job.task, "instance_id", job.task)),
                status=INFRA_FAILURE,
                reward=0.0,
                error=f"{why}; {t.attempt + 1} attempt(s), max_retries={self.max_retries}",
                failed_stage="infra",
                info=AttemptInfo(attempt=t.attempt, masked=True, cause=INFRA, infra_kind="worker"),
            )
        )

    # ---- helpers --------------------------------------------------------------------------
    async def _watch_metrics(self, period: float = 1.0) -> None:
        while True:
            live = [w for w in self.workers if w.alive]
            got = await asyncio.gather(*(w.actor.metrics.remote() for w in live), return_exceptions=True)
            for w, m in zip(live, got, strict=True):
                if isinstance(m, dict):
                    self._worker_metrics[w.index] = m
            await asyncio.sleep(period)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


_MEAN = ("_busy", "_busy_s", "engine_busy", "/paused", "/token_faithful", "/uptime_s")


def merge_metrics(per_worker: list[dict[str, float]]) -> dict[str, float]:
    """One view of several workers' gauges: counts add up, fractions average, latencies take the max."""
    keys = {k for m in per_worker for k in m}
    out: dict[str, float] = {}
    for k in keys:
        vals = [float(m[k]) for m in per_worker if k in m]
        if "latency" in k:
            out[k] = max(vals)
        elif k.endswith(_MEAN):
            out[k] = sum(vals) / len(vals)
        else:
            out[k] = sum(vals)
    return out
