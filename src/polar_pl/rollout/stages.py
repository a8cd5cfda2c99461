"""The real work of each stage for one task attempt: sandbox, harness, gateway session, evaluator,
trajectory builder. Plugged into `StagePools` by the RolloutDataModule (and the SFT generator).

INIT     start a sandbox, put the task's repository in it, commit the baseline.
RUNNING  register a gateway session, start pre-warming the evaluation sandbox, run the harness
         until it exits or the deadline passes (the sandbox kills the whole process tree).
POSTRUN  evaluate the patch and answer in the pre-warmed sandbox (never the agent's), read the
         session's trace records, build trajectory rows with the reward.
cleanup  stop the sandbox, release the evaluator handle, end the gateway session.

Infrastructure failures (`InfraError` from the sandbox, or an evaluation that reports
`infra_failure`) end the attempt with status `infra_failure`: no rows, whatever the options say.
`prefetch` (called by the rollout service for the tasks ahead of its cursor) asks the sandbox
factory to start pulling / building their images, so INIT finds them ready.

Blocking work (docker, subprocesses, HTTP) runs in worker threads via `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polar_pl.gateway.handle import Gateway
from polar_pl.gateway.store.records import TraceRecord
from polar_pl.harness.protocol import GatewaySession, Harness
from polar_pl.harness.run import run_harness
from polar_pl.rollout.outcome import INFRA, classify
from polar_pl.rollout.pools import (
    FAILED,
    HARNESS_ERROR,
    INFRA_FAILURE,
    OK,
    TIMEOUT,
    AttemptInfo,
    RolloutJob,
    RolloutResult,
)
from polar_pl.sandbox.infra import InfraError
from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.evaluator import Evaluator
from polar_pl.tasks.workspace import new_sandbox, prepare_workspace
from polar_pl.trajectory.base import BuildResult, TrajectoryBuilder

TIMEOUT_POLICIES = ("train_zero", "mask")


@dataclass(frozen=True, slots=True)
class RolloutOptions:
    """model: the name harnesses ask for. timeout_policy: a timed-out attempt's rows are trained
    with reward 0 (`train_zero`) or dropped (`mask`). failed_rows: keep rows of crashed harness runs
    (reward 0) or drop them."""

    model: str = "polar-tiny"
    timeout_policy: str = "train_zero"
    keep_failed_rows: bool = False
    setup_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.timeout_policy not in TIMEOUT_POLICIES:
            raise ValueError(
                f"datamodule.timeout_policy={self.timeout_policy!r}: allowed values are {TIMEOUT_POLICIES}"
            )


class HarnessRolloutStages:
    """`RolloutStages` for one harness, one sandbox backend, one evaluator and one merge builder."""

    def __init__(
        self,
        gateway: Gateway,
        sandbox_factory: Callable[[], Sandbox],
        harness: Harness,
        evaluator: Evaluator,
        builder: TrajectoryBuilder,
        options: RolloutOptions = RolloutOptions(),
    ) -> None:
        self.gateway, self.sandbox_factory, self.harness = gateway, sandbox_factory, harness
        self.evaluator, self.builder, self.options = evaluator, builder, options

    @property
    def prefetch_depth(self) -> int:
        """How many tasks ahead of the cursor the service should hand to `prefetch`."""
        return int(getattr(self.sandbox_factory, "prefetch_tasks", 0) or 0)

    def prefetch(self, tasks: list[Any]) -> None:
        """Start making the images of these upcoming tasks present (returns at once)."""
        fetch = getattr(self.sandbox_factory, "prefetch", None)
        images = [(t.image, t.image_context) for t in tasks if getattr(t, "image", None)]
        if fetch is not None and images:
            fetch(images)

    async def init(self, job: RolloutJob) -> None:
        def start() -> None:
            sandbox = new_sandbox(self.sandbox_factory, job.task)
            job.state["sandbox"] = sandbox  # set before start(): cleanup must see a half-started one
            sandbox.start()
            prepare_workspace(job.task, sandbox, setup_timeout=self.options.setup_timeout_s)

        # A cancelled INIT (the pools stopping) waits for its thread: cleanup must not stop the
        # sandbox while start() is still making it, or the start leaves its workspace behind.
        starting = asyncio.ensure_future(asyncio.to_thread(start))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            await asyncio.gather(starting, return_exceptions=True)
            raise

    async def run(self, job: RolloutJob) -> None:
        task = job.task
        session = self.gateway.create_session(
            task_id=task.instance_id,
            group_id=job.group_id,
            rollout_id=job.rollout_id,
            harness=self.harness.name,
        )
        job.state["session"] = session
        job.state["eval"] = self.evaluator.prewarm(task)  # fresh sandbox, overlaps the agent's run
        timeout = max(1.0, job.deadline - time.monotonic()) if job.deadline else None
        result = await asyncio.to_thread(
            run_harness,
            self.harness,
            job.state["sandbox"],
            GatewaySession(session.base_url, session.token, self.options.model),
            task.prompt,
            timeout=timeout,
            baseline=False,  # prepare_workspace committed the baseline
        )
        job.state["harness"] = result
        if result.timed_out:
            job.status, job.error = TIMEOUT, f"harness timed out after {result.duration_s:.0f}s"
            return
        records = await asyncio.to_thread(self.gateway.records, session.session_id, packed=True)
        outcome = classify(
            result.exit_code, result.stderr, result.stdout, records, self.harness.policy_exit_codes
        )
        if outcome.failed:  # its answer is the harness's error text: never evaluated
            job.status, job.error = HARNESS_ERROR, outcome.reason
            job.state["cause"] = outcome.cause

    async def postrun(self, job: RolloutJob) -> RolloutResult:
        task, hres = job.task, job.state.get("harness")
        ev = None
        if job.status == OK and hres is not None:
            # the handle stays in the job until evaluate returns: cleanup discards one it raised on
            ev = await asyncio.to_thread(self.evaluator.evaluate, job.state["eval"], hres.patch, hres.answer)
            del job.state["eval"]
            if ev.status == "error":
                job.fail("postrun", f"evaluator: {ev.reason}")
            elif ev.status == "infra_failure":
                job.fail("postrun", InfraError(ev.infra_kind or "start", f"evaluator: {ev.reason}"))
        reward = ev.reward if ev is not None else 0.0
        session = job.state.get("session")
        build: dict[str, Any] = {"reward": reward, "status": job.status, "harness": self.harness.name}
        if session is not None:
            records, built = await asyncio.to_thread(
                read_and_merge, self.gateway, self.builder, session.session_id, **build
            )
        else:
            records, built = [], self.builder.build([], **build)
        masked = (
            job.status == INFRA_FAILURE
            or (job.status == TIMEOUT and self.options.timeout_policy == "mask")
            or (job.status == FAILED and not self.options.keep_failed_rows)
            or (job.status == HARNESS_ERROR and job.state.get("cause") == INFRA)
        )
        info = AttemptInfo(
            harness=self.harness.name,
            exit_code=hres.exit_code if hres is not None else None,
            patch_bytes=len(hres.patch) if hres is not None else None,
            answer=hres.answer if hres is not None else None,
            eval_status=ev.status if ev is not None else None,
            eval_reason=ev.reason if ev is not None else None,
            tests=ev.counts() if ev is not None else {},
            session_id=session.session_id if session is not None else None,
            harness_error=job.state.get("cause") if job.status == HARNESS_ERROR else None,
            infra_kind=job.infra_kind,
            calls=len(records),
            merge=built.stats.to_metrics("merge"),
            masked=masked,
        )
        return RolloutResult(
            rollout_id=job.rollout_id,
            group_id=job.group_id,
            task_id=task.instance_id,
            status=job.status,
            reward=reward,
            rows=() if masked else tuple(_with_ids(built.rows, job)),
            error=job.error,
            failed_stage=job.failed_stage,
            timings=dict(job.timings),
            info=info,
        )

    async def cleanup(self, job: RolloutJob) -> None:
        def stop() -> None:
            errors: list[str] = []
            if (handle := job.state.pop("eval", None)) is not None:
                _collect(errors, self.evaluator.discard, handle)
            if (sandbox := job.state.pop("sandbox", None)) is not None:
                _collect(errors, sandbox.stop)
            if (session := job.state.pop("session", None)) is not None:
                _collect(errors, self.gateway.delete_session, session.session_id)
            if errors:
                raise RuntimeError("; ".join(errors))

        await asyncio.to_thread(stop)


def read_and_merge(
    source: Any, builder: TrajectoryBuilder, session_id: str, **build: Any
) -> tuple[list[TraceRecord], BuildResult]:
    """A finished session's records and its rows, as training gets them: read packed (token
    fields are arrays over the store's blobs, no per-token Python objects) and merged by `builder`.
    source: anything with `records(session_id, packed=...)` (the gateway, a TraceStore)."""
    records = source.records(session_id, packed=True)
    return records, builder.build(records, **build)


def _collect(errors: list[str], fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:
        errors.append(f"{getattr(fn, '__qualname__', fn)}: {type(exc).__name__}: {exc}")


def _with_ids(rows, job: RolloutJob):
    """Rows carry the pool's rollout / group ids (the builder only knows the session's)."""
    from dataclasses import replace

    for row in rows:
        yield replace(row, rollout_id=job.rollout_id, group_id=job.group_id)
