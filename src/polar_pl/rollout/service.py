"""The rollout service: stage pools, task feeder and group collector on a background event loop.

The trainer's thread asks for complete GRPO groups (`next_groups`); meanwhile the service keeps
preparing and running the next ones, so rollouts for step k+1 overlap training of step k. How far
ahead it may run is bounded by `max_groups_in_flight`; 0 runs one stage after another (groups
start only while `next_groups` waits for them: the baseline of bench/real_pipeline.py).
`stop_feeding` (any thread, a signal handler's) admits no new rollout from then on and makes a waiting `next_groups` raise
`RolloutsStopped`; `stop` cancels what runs (each job's cleanup kills its harness) and may be
called from several threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from polar_pl.errors import RunFailed
from polar_pl.rollout.pools import (
    OK,
    JobPools,
    PoolSizes,
    PrefetchingStages,
    RolloutJob,
    RolloutResult,
    RolloutStages,
    StagePools,
)
from polar_pl.rollout.tasks import TaskQueue

log = logging.getLogger(__name__)


class RolloutsStopped(RuntimeError):
    """The service admits no more rollouts (the run is shutting down)."""


class PartDown(RunFailed):
    """A part every rollout needs (the engine, the gateway) stopped answering: the run cannot go on."""


@dataclass(frozen=True, slots=True)
class Group:
    """All attempts at one task for one GRPO group; `missing` lists attempts cut by the deadline."""

    group_id: str
    seq: int
    task: Any
    results: tuple[RolloutResult, ...]
    missing: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.missing


@dataclass(slots=True)
class _Pending:
    seq: int
    task: Any
    rollout_ids: list[str]
    started: float
    results: list[RolloutResult] = field(default_factory=list)


class RolloutService:
    """Runs `StagePools` over a task sequence on its own thread.

    tasks: indexable task source; task `seq` i is `tasks[i % len(tasks)]` (a `TaskQueue`: `tasks[i]`,
    once submitted).
    group_size: attempts per task (G). group_deadline_s: a group is released with what finished
    by then. start_seq / skip_seqs: resume point (see `state_dict`). limit: feed only seqs below
    it (a bounded run, such as SFT data generation, starts no group it will not collect).
    stages: what each stage does (None when `pools` runs the jobs elsewhere).
    pools: a zero-argument factory, called on the service's event loop, for what runs the jobs
    (default: `StagePools(stages, sizes)` in this process; `polar_pl.rollout.ray_pools.RayPools`
    spreads them over Ray workers). It needs `start()`, `await submit(job)`, a `results` queue,
    `metrics()` and `await stop()`.
    """

    def __init__(
        self,
        stages: RolloutStages | None,
        tasks: Sequence[Any],
        *,
        group_size: int,
        sizes: PoolSizes,
        max_groups_in_flight: int = 2,
        group_deadline_s: float | None = None,
        start_seq: int = 0,
        skip_seqs: Sequence[int] = (),
        id_prefix: str | None = None,
        limit: int | None = None,
        pools: Callable[[], JobPools] | None = None,
    ) -> None:
        if len(tasks) == 0 and not isinstance(tasks, TaskQueue):
            raise ValueError("task source is empty: datamodule needs at least one task")
        self.stages, self.tasks, self.sizes = stages, tasks, sizes
        self.group_size = group_size
        self.max_groups_in_flight = max_groups_in_flight
        self.group_deadline_s = group_deadline_s
        self.next_seq = start_seq
        self.limit = limit
        self.consumed: set[int] = set(skip_seqs)
        self._taken: set[int] = set(skip_seqs)  # handed out (consumed or not): never fed again
        self.id_prefix = id_prefix or uuid.uuid4().hex[:6]
        self.late_results = 0
        self.released = 0  # groups released (complete or at their deadline) since start
        self._first_logged = False
        self.last_failure: str | None = None  # the latest failed attempt's reason, for status lines
        self._demand = 0
        self._ready: list[Group] = []
        self._cond = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-service", daemon=True)
        self._main: Future | None = None
        self._main_task: asyncio.Task | None = None
        self._make_pools: Callable[[], JobPools] = pools or self._stage_pools
        self.pools: JobPools | None = None
        self.error: BaseException | None = None
        self.stopping = False
        self._stop_lock = threading.Lock()
        # checked while next_groups waits: why no rollout can succeed any more, or None
        self.health: Callable[[], str | None] | None = None

    # ---- trainer-thread API -------------------------------------------------------------
    def start(self) -> RolloutService:
        self._thread.start()
        self._main = asyncio.run_coroutine_threadsafe(self._run(), self._loop)
        self._main.add_done_callback(self._on_main_done)
        return self

    def next_groups(self, n: int, timeout: float | None = None, *, consume: bool = True) -> list[Group]:
        """Block until n groups are released (complete or past their deadline); oldest first.

        consume=False leaves marking them consumed (the resume cursor) to `mark_consumed`, for a
        caller that trains on them later (Lightning fetches a batch ahead of the step).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._demand = n  # the feeder may run ahead of at least one request's worth
            while len(self._ready) < n:
                if self.error is not None:
                    raise RuntimeError("rollout service failed") from self.error
                if self.stopping:
                    raise RolloutsStopped(f"rollouts stopped with {len(self._ready)} of {n} groups ready")
                if self.health is not None and (problem := self.health()) is not None:
                    raise PartDown(problem)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"only {len(self._ready)} of {n} groups ready after {timeout}s")
                self._cond.wait(timeout=left if left is not None else 1.0)
            self._ready.sort(key=lambda g: g.seq)
            out, self._ready = self._ready[:n], self._ready[n:]
            if self.max_groups_in_flight == 0:
                self._demand = 0  # one stage after another: nothing more until asked
            self._taken.update(g.seq for g in out)
            if consume:
                self.consumed.update(g.seq for g in out)
            self._cond.notify_all()
        return out

    def mark_consumed(self, seqs: Sequence[int]) -> None:
        """Record that training used these groups (they are skipped after a resume)."""
        with self._cond:
            self.consumed.update(seqs)

    def metrics(self) -> dict[str, float]:
        if self.pools is None:
            return {}
        fut = asyncio.run_coroutine_threadsafe(self._metrics(), self._loop)
        return fut.result(timeout=10)

    def state_dict(self) -> dict[str, Any]:
        """Resume point: every seq below `start_seq` was consumed by training, plus `skip_seqs`."""
        with self._cond:
            start = 0
            while start in self.consumed:
                start += 1
            return {"start_seq": start, "skip_seqs": sorted(s for s in self.consumed if s > start)}

    def stop_feeding(self) -> None:
        """Admit no new rollout from now on; waiting `next_groups` calls raise RolloutsStopped."""
        with self._cond:
            self.stopping = True
            self._cond.notify_all()

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel everything; each job's cleanup runs before this returns."""
        self.stop_feeding()
        with self._stop_lock:
            self._stop(timeout)

    def _stop(self, timeout: float) -> None:
        if not self._thread.is_alive():
            return

        async def cancel_main() -> None:
            task = self._main_task
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_main(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._loop.close()

    # ---- event-loop side ----------------------------------------------------------------
    async def _metrics(self) -> dict[str, float]:
        assert self.pools is not None
        m = self.pools.metrics()
        with self._cond:
            m["pool/groups_ready"] = len(self._ready)
        m["pool/late_results"] = self.late_results
        m["pool/groups_released"] = self.released
        return m

    def _on_main_done(self, fut: Future) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            with self._cond:
                self.error = fut.exception()
                self._cond.notify_all()

    async def _run(self) -> None:
        self._main_task = asyncio.current_task()
        # Every stage worker may sit in asyncio.to_thread at once (a harness run blocks one for its
        # whole length); the loop's default executor has only cpu_count + 4 threads, so on a small
        # machine POSTRUN waited for RUNNING to free one.
        workers = self.sizes.init + self.sizes.running + self.sizes.postrun + 2
        executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout-stage")
        asyncio.get_running_loop().set_default_executor(executor)
        self.pools = self._make_pools()
        self.pools.start()
        pending: dict[str, _Pending] = {}
        feeder = asyncio.create_task(self._feed(pending))
        try:
            await self._collect(pending)
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)
            await self.pools.stop()

    def _in_flight(self, pending: dict[str, _Pending]) -> int:
        with self._cond:
            return len(pending) + len(self._ready)

    async def _feed(self, pending: dict[str, _Pending]) -> None:
        pools = self.pools
        assert pools is not None  # _run made them before feeding
        while not self.stopping:
            while self._in_flight(pending) >= max(self.max_groups_in_flight, self._demand):
                await asyncio.sleep(0.01)
            if self.stopping:
                return
            seq = self.next_seq
            if self.limit is not None and seq >= self.limit:
                return
            self.next_seq += 1
            if seq in self._taken:
                continue
            task = await self._task(seq)
            self._prefetch(seq)
            group_id = f"{self.id_prefix}-g{seq}"
            ids = [f"{group_id}-r{m}" for m in range(self.group_size)]
            pending[group_id] = _Pending(seq, task, ids, time.monotonic())
            for m, rid in enumerate(ids):
                if self.stopping:  # a group half admitted: its other attempts are not started
                    return
                await pools.submit(RolloutJob(rid, group_id, task, member=m))

    def _stage_pools(self) -> JobPools:
        if self.stages is None:
            raise ValueError("RolloutService: no stages and no pools to run the jobs")
        return StagePools(self.stages, self.sizes)

    async def _task(self, seq: int) -> Any:
        if isinstance(self.tasks, TaskQueue):  # a queue fed from outside: seq i is task i
            await self.tasks.wait(seq)
            return self.tasks[seq]
        return self.tasks[seq % len(self.tasks)]

    def _prefetch(self, seq: int) -> None:
        """Hand the stages the tasks that come after `seq` (images pulled ahead of the cursor)."""
        if not isinstance(self.stages, PrefetchingStages) or isinstance(self.tasks, TaskQueue):
            return  # a task queue has no known future
        depth = self.stages.prefetch_depth
        if depth:
            end = seq + 1 + depth if self.limit is None else min(seq + 1 + depth, self.limit)
            upcoming = range(seq, end)
            self.stages.prefetch([self.tasks[s % len(self.tasks)] for s in upcoming if s not in self._taken])

    async def _collect(self, pending: dict[str, _Pending]) -> None:
        assert self.pools is not None
        while True:
            try:
                async with asyncio.timeout(0.5):
                    result = await self.pools.results.get()
            except TimeoutError:
                result = None
            if result is not None:
                if not self._first_logged:
                    self._first_logged = True
                    _log_first(result)
                if result.status != OK and result.error:
                    self.last_failure = f"{result.failed_stage or result.status}: {result.error}"
                p = pending.get(result.group_id)
                if p is None:
                    self.late_results += 1  # its group was released at the deadline already
                else:
                    p.results.append(result)
                    if len(p.results) == self.group_size:
                        self._release(pending, result.group_id)
            if self.group_deadline_s is not None:
                now = time.monotonic()
                for gid in [g for g, p in pending.items() if now - p.started > self.group_deadline_s]:
                    self._release(pending, gid)

    def _release(self, pending: dict[str, _Pending], group_id: str) -> None:
        p = pending.pop(group_id)
        done = {r.rollout_id for r in p.results}
        group = Group(
            group_id=group_id,
            seq=p.seq,
            task=p.task,
            results=tuple(sorted(p.results, key=lambda r: r.rollout_id)),
            missing=tuple(r for r in p.rollout_ids if r not in done),
        )
        with self._cond:
            self._ready.append(group)
            self.released += 1
            self._cond.notify_all()


def _log_first(result: RolloutResult) -> None:
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items() if k != "submitted")
    log.info(
        "first rollout: %s, reward %.3f (%s)%s", result.status, result.reward, stages,
        f": {result.error}" if result.error else "",
    )  # fmt: skip
