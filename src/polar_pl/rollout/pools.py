"""Stage pools: INIT → READY → RUNNING → POSTRUN, each with its own bounded concurrency.

Slow sandbox start-up (INIT) and evaluation (POSTRUN) run in their own worker pools so the
RUNNING pool, which holds the engine, always finds a prepared session waiting in the bounded READY
buffer. Bounded queues between stages give backpressure: a stage that runs ahead blocks on the
next stage's queue instead of flooding it.

The pools know nothing of sandboxes or harnesses: they drive a `RolloutStages` object (the real
one lives in `rollout.py`; the pipeline benchmark plugs in simulated stages).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from polar_pl.sandbox.infra import InfraError
from polar_pl.tasks.results import EvalStatus
from polar_pl.trajectory.rows import TrajectoryRow

OK, TIMEOUT, FAILED = "ok", "timeout", "failed"
HARNESS_ERROR = "harness_error"  # the CLI exited non-zero or got an API error (rollout/outcome.py)
# The infrastructure failed (sandbox start, image, exec, copy, host; a lost rollout worker or node
# with its retries spent), not the policy: never trained.
INFRA_FAILURE = "infra_failure"


@dataclass(slots=True)
class RolloutJob:
    """One task attempt travelling through the stages (mutable; owned by one stage at a time).

    `state` holds stage-private objects (sandbox, gateway session, harness result, evaluator
    handle); `deadline` is the monotonic time by which RUNNING must end.
    """

    rollout_id: str
    group_id: str
    task: Any
    member: int = 0
    status: str = OK
    error: str | None = None
    failed_stage: str | None = None
    deadline: float | None = None
    state: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    infra_kind: str | None = None  # set with status INFRA_FAILURE: start / image / exec / copy / host

    def fail(self, stage: str, exc: BaseException | str) -> None:
        """Record a failure; an `InfraError` makes it an infrastructure failure of its kind."""
        self.status = FAILED
        self.failed_stage = stage
        self.error = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, InfraError):
            self.status, self.infra_kind = INFRA_FAILURE, exc.kind


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """What is known of an attempt beyond its status and reward. Every field has a default: each
    writer sets what it knows (a failed INIT knows its `infra_kind`, the pools of `rollout=ray` add
    where it ran)."""

    harness: str | None = None
    exit_code: int | None = None  # the harness CLI's exit status (137 after a timeout kill)
    patch_bytes: int | None = None  # size of the diff the harness left in the workspace
    answer: str | None = None  # the harness's final message
    eval_status: EvalStatus | None = None  # None: not evaluated (the harness did not end cleanly)
    eval_reason: str | None = None
    tests: dict[str, int] = field(default_factory=dict)  # f2p/p2p passed and total (EvalResult.counts)
    session_id: str | None = None  # the gateway session that holds the attempt's model calls
    harness_error: str | None = None  # with status harness_error, who caused it: "policy" or "infra"
    infra_kind: str | None = None  # with status infra_failure: start / image / exec / copy / host / worker
    calls: int = 0  # model calls the gateway recorded for the session
    merge: dict[str, float] = field(default_factory=dict)  # MergeStats.to_metrics("merge") of its rows
    masked: bool = False  # its rows were dropped: nothing of it trains
    worker: str | None = None  # rollout=ray: the worker actor that ran it
    node: str | None = None  # rollout=ray: that worker's node
    attempt: int | None = None  # rollout=ray: 0 for the first try, n for the n-th retry
    cause: str | None = None  # rollout=ray, a job lost with its worker and retries spent: "infra"

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set (neither None nor empty) as plain data: `info` in the rollout
        service's JSON and in the SFT log, where readers take a missing key for the default."""
        return {k: v for k, v in asdict(self).items() if v is not None and v != {}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttemptInfo:
        """The inverse of `as_dict`; keys this version does not know (a newer service's) are left out."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True, slots=True)
class RolloutResult:
    """What POSTRUN hands to the trainer for one task attempt."""

    rollout_id: str
    group_id: str
    task_id: str
    status: str
    reward: float
    rows: tuple[TrajectoryRow, ...] = ()
    error: str | None = None
    failed_stage: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    info: AttemptInfo = field(default_factory=AttemptInfo)


class RolloutStages(Protocol):
    """The work of each stage for one job. Every method may raise; the pools record the failure."""

    async def init(self, job: RolloutJob) -> None:
        """INIT: start the sandbox and prepare the task in it."""

    async def run(self, job: RolloutJob) -> None:
        """RUNNING: run the harness against a gateway session until exit or `job.deadline`.

        Cancelled by the pools when the deadline passes: it must then kill the harness.
        """

    async def postrun(self, job: RolloutJob) -> RolloutResult:
        """POSTRUN: extract the patch, evaluate, build trajectory rows. Runs after timeouts and
        RUNNING failures too (the partial trace is kept)."""

    async def cleanup(self, job: RolloutJob) -> None:
        """Called exactly once per job, last, whatever happened: stop sandboxes, end sessions."""


@runtime_checkable
class PrefetchingStages(RolloutStages, Protocol):
    """Stages that can get ready for tasks ahead of the feed (images pulled before their turn)."""

    @property
    def prefetch_depth(self) -> int:
        """How many tasks ahead of the cursor the service should hand to `prefetch` (0: none)."""

    def prefetch(self, tasks: list[Any]) -> None:
        """Start getting ready for these upcoming tasks; returns at once."""


class Results(Protocol):
    async def get(self) -> RolloutResult:
        """The next finished job (raises what stopped the pools, if they failed)."""


class JobPools(Protocol):
    """What runs a service's jobs: `StagePools` in this process, `RayPools` on rollout workers.
    Every method is called on the service's event loop."""

    @property
    def results(self) -> Results: ...

    def start(self) -> None: ...

    async def submit(self, job: RolloutJob) -> None:
        """Blocks while the pools are full (backpressure towards the task feeder)."""

    def metrics(self) -> dict[str, float]: ...

    async def stop(self) -> None: ...


class Occupancy:
    """Time-integral of a count (busy workers, in-flight engine calls): busy fraction over a window."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.count = 0
        self._area = 0.0
        self._last = time.monotonic()
        self._start = self._last

    def _advance(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._area += self.count * (now - self._last)
        self._last = now

    def enter(self) -> None:
        self._advance()
        self.count += 1

    def leave(self) -> None:
        self._advance()
        self.count -= 1

    def fraction(self) -> float:
        """Mean occupied share of capacity since construction (or the last reset)."""
        self._advance()
        span = self._last - self._start
        return self._area / (span * self.capacity) if span > 0 else 0.0

    def busy_s(self, now: float | None = None) -> float:
        """Occupied capacity-seconds since construction (or the last reset), divided by capacity,
        up to `now` (a `time.monotonic()` reading): differences of it over a window, divided by the
        window's length on the same clock, give that window's busy fraction."""
        self._advance(now)
        return self._area / self.capacity if self.capacity else 0.0

    def reset(self) -> None:
        self._advance()
        self._area, self._start = 0.0, self._last


@dataclass(frozen=True, slots=True)
class PoolSizes:
    """Bounded concurrency per stage and the READY buffer size (Hydra group `datamodule/`)."""

    init: int = 4
    ready: int = 4
    running: int = 4
    postrun: int = 2
    run_timeout_s: float = 300.0
    cancel_grace_s: float = 10.0


class StagePools:
    """Worker pools for the four stages, on one asyncio event loop.

    `submit` blocks while the INIT queue is full (backpressure towards the task feeder);
    finished `RolloutResult`s appear on `results`.
    """

    def __init__(self, stages: RolloutStages, sizes: PoolSizes) -> None:
        self.stages = stages
        self.sizes = sizes
        self.init_q: asyncio.Queue[RolloutJob] = asyncio.Queue(maxsize=sizes.init)
        self.ready_q: asyncio.Queue[RolloutJob] = asyncio.Queue(maxsize=sizes.ready)
        # RUNNING must never wait on POSTRUN (that would idle the engine): room for every runner.
        self.post_q: asyncio.Queue[RolloutJob] = asyncio.Queue(maxsize=sizes.running + sizes.postrun)
        self.results: asyncio.Queue[RolloutResult] = asyncio.Queue()
        self.started = time.monotonic()
        self.busy = {
            "init": Occupancy(sizes.init),
            "running": Occupancy(sizes.running),
            "postrun": Occupancy(sizes.postrun),
        }
        self.statuses: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.infra: Counter[str] = Counter()  # infrastructure failures by kind, since the start
        self._workers: list[asyncio.Task] = []
        self._live: dict[str, RolloutJob] = {}

    def start(self) -> None:
        spawn = asyncio.get_running_loop().create_task
        self._workers = (
            [spawn(self._init_worker(), name=f"init-{i}") for i in range(self.sizes.init)]
            + [spawn(self._run_worker(), name=f"run-{i}") for i in range(self.sizes.running)]
            + [spawn(self._post_worker(), name=f"post-{i}") for i in range(self.sizes.postrun)]
        )

    async def stop(self) -> None:
        """Cancel the workers, then clean up every job not yet cleaned (queued or interrupted)."""
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        for job in list(self._live.values()):
            await self._cleanup(job)

    async def submit(self, job: RolloutJob) -> None:
        job.timings["submitted"] = time.monotonic()
        self._live[job.rollout_id] = job
        await self.init_q.put(job)

    async def _init_worker(self) -> None:
        while True:
            job = await self.init_q.get()
            with _busy(self.busy["init"]), _timed(job, "init"):
                try:
                    await self.stages.init(job)
                except Exception as exc:
                    job.fail("init", exc)
            if job.status in (FAILED, INFRA_FAILURE):
                await self._finish_failed(job)
            else:
                await self.ready_q.put(job)  # blocks while READY is full: backpressure

    async def _run_worker(self) -> None:
        while True:
            job = await self.ready_q.get()
            # a task's own agent timeout (Harbor's [agent].timeout_sec) can only shorten the pool's
            limit = min(self.sizes.run_timeout_s, getattr(job.task, "agent_timeout_s", None) or float("inf"))
            job.deadline = time.monotonic() + limit
            with _busy(self.busy["running"]), _timed(job, "running"):
                try:
                    async with asyncio.timeout(limit + self.sizes.cancel_grace_s):
                        await self.stages.run(job)
                except TimeoutError:
                    job.status, job.error = TIMEOUT, f"RUNNING exceeded {limit:.0f}s"
                except Exception as exc:
                    job.fail("running", exc)
            await self.post_q.put(job)  # timeouts and failures still go through POSTRUN

    async def _post_worker(self) -> None:
        while True:
            job = await self.post_q.get()
            with _busy(self.busy["postrun"]), _timed(job, "postrun"):
                try:
                    result = await self.stages.postrun(job)
                except Exception as exc:
                    job.fail(job.failed_stage or "postrun", exc)
                    result = _failed_result(job)
                finally:
                    await self._cleanup(job)
            result.timings.update(job.timings)  # POSTRUN's own time is known only now
            self._publish(result)

    async def _finish_failed(self, job: RolloutJob) -> None:
        await self._cleanup(job)
        self._publish(_failed_result(job))

    async def _cleanup(self, job: RolloutJob) -> None:
        if self._live.pop(job.rollout_id, None) is None:
            return  # already cleaned
        try:
            await self.stages.cleanup(job)
        except Exception as exc:
            self.failures["cleanup"] += 1
            if job.error is None:
                job.error = f"cleanup: {type(exc).__name__}: {exc}"

    def _publish(self, result: RolloutResult) -> None:
        self.statuses[result.status] += 1
        if result.status == INFRA_FAILURE:
            self.infra[result.info.infra_kind or "unknown"] += 1
        if result.failed_stage:
            self.failures[result.failed_stage] += 1
        self.results.put_nowait(result)

    def metrics(self) -> dict[str, float]:
        """Slash-keyed gauges for the logger: queue lengths, busy fraction per stage, statuses.
        `pool/<stage>_busy_s` and `pool/uptime_s` are read at one instant: the busy fraction of a
        window is the difference of the one over the difference of the other."""
        now = time.monotonic()
        m: dict[str, float] = {
            "pool/uptime_s": now - self.started,
            "pool/init_queue": self.init_q.qsize(),
            "pool/ready_queue": self.ready_q.qsize(),
            "pool/postrun_queue": self.post_q.qsize(),
        }
        for stage, occ in self.busy.items():
            m[f"pool/{stage}_busy"] = occ.fraction()
            m[f"pool/{stage}_busy_s"] = occ.busy_s(now)
            m[f"pool/{stage}_active"] = occ.count
            m[f"pool/{stage}_capacity"] = occ.capacity
        for status, n in self.statuses.items():
            m[f"pool/sessions_{status}"] = n
        for stage, n in self.failures.items():
            m[f"pool/failures_{stage}"] = n
        for kind, n in self.infra.items():
            m[f"pool/infra_failures/{kind}"] = n
        return m


def _failed_result(job: RolloutJob) -> RolloutResult:
    return RolloutResult(
        rollout_id=job.rollout_id,
        group_id=job.group_id,
        task_id=str(getattr(job.task, "instance_id", job.task)),
        status=job.status if job.status == INFRA_FAILURE else FAILED,
        reward=0.0,
        error=job.error,
        failed_stage=job.failed_stage,
        timings=dict(job.timings),
        info=AttemptInfo(infra_kind=job.infra_kind),
    )


class _busy:
    def __init__(self, occ: Occupancy) -> None:
        self.occ = occ

    def __enter__(self) -> None:
        self.occ.enter()

    def __exit__(self, *exc) -> None:
        self.occ.leave()


class _timed:
    def __init__(self, job: RolloutJob, stage: str) -> None:
        self.job, self.stage = job, stage

    def __enter__(self) -> None:
        self.t0 = time.monotonic()

    def __exit__(self, *exc) -> None:
        self.job.timings[self.stage] = time.monotonic() - self.t0
