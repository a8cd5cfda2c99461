"""Stage pools and the rollout service, driven by simulated stages (the stages are not under test)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest

from polar_pl.monitor.batch import BusyFractions
from polar_pl.rollout.pools import FAILED, OK, TIMEOUT, PoolSizes, RolloutJob, RolloutResult, StagePools
from polar_pl.rollout.service import RolloutService


class SimStages:
    """Sleeps per stage; behaviour per task name: 'hang', 'crash', 'evalcrash', 'initfail'."""

    def __init__(self, init_s=0.01, run_s=0.02, post_s=0.01):
        self.init_s, self.run_s, self.post_s = init_s, run_s, post_s
        self.cleaned: Counter[str] = Counter()
        self.partial: dict[str, bool] = {}  # per rollout: POSTRUN found no answer from RUNNING
        self.started: set[str] = set()
        self.running = 0
        self.max_running = 0
        self.lock = threading.Lock()

    async def init(self, job: RolloutJob) -> None:
        self.started.add(job.rollout_id)
        await asyncio.sleep(self.init_s)
        if job.task == "initfail":
            raise RuntimeError("sandbox did not start")

    async def run(self, job: RolloutJob) -> None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if job.task == "hang":
                await asyncio.sleep(3600)
            if job.task == "crash":
                raise RuntimeError("harness crashed")
            await asyncio.sleep(self.run_s)
            job.state["answer"] = job.member
        finally:
            self.running -= 1

    async def postrun(self, job: RolloutJob) -> RolloutResult:
        await asyncio.sleep(self.post_s)
        if job.task == "evalcrash":
            raise RuntimeError("evaluator crashed")
        self.partial[job.rollout_id] = "answer" not in job.state
        return RolloutResult(
            job.rollout_id,
            job.group_id,
            str(job.task),
            job.status,
            float(job.state.get("answer", 0)),
            error=job.error,
            failed_stage=job.failed_stage,
        )

    async def cleanup(self, job: RolloutJob) -> None:
        with self.lock:
            self.cleaned[job.rollout_id] += 1


class BlockingStages(SimStages):
    """RUNNING and POSTRUN block in worker threads, as the real stages do (subprocess, HTTP)."""

    def __init__(self, barrier: threading.Barrier):
        super().__init__()
        self.barrier = barrier

    async def run(self, job: RolloutJob) -> None:
        await asyncio.to_thread(self.barrier.wait)
        job.state["answer"] = job.member

    async def postrun(self, job: RolloutJob) -> RolloutResult:
        await asyncio.to_thread(time.sleep, 0.01)
        return await super().postrun(job)


def test_every_stage_worker_gets_a_thread():
    """RUNNING 8 wide on a 2-core machine: each harness run blocks a thread, and the event loop's
    default executor (cpu_count + 4 = 6 threads) starved the rest: runs queued behind each other and
    POSTRUN waited a minute for a thread. All 8 runs must be in their threads at once."""
    barrier = threading.Barrier(8, timeout=20)
    sizes = PoolSizes(init=4, ready=8, running=8, postrun=4, run_timeout_s=60, cancel_grace_s=1)
    svc = make(BlockingStages(barrier), ["a"], g=8, sizes=sizes).start()
    try:
        (group,) = svc.next_groups(1, timeout=60)
    finally:
        svc.stop()
    assert group.complete and all(r.status == OK for r in group.results), [r.error for r in group.results]


def make(stages, tasks, g=4, **kw):
    sizes = kw.pop(
        "sizes", PoolSizes(init=2, ready=2, running=3, postrun=2, run_timeout_s=0.3, cancel_grace_s=0.1)
    )
    return RolloutService(stages, tasks, group_size=g, sizes=sizes, **kw)


def test_full_groups_with_rewards_and_every_job_cleaned_once():
    stages = SimStages()
    svc = make(stages, ["a", "b"], max_groups_in_flight=3).start()
    try:
        groups = svc.next_groups(4, timeout=30)
    finally:
        svc.stop()
    assert [g.seq for g in groups] == [0, 1, 2, 3]
    assert [g.task for g in groups] == ["a", "b", "a", "b"]
    for g in groups:
        assert g.complete and len(g.results) == 4
        assert sorted(r.reward for r in g.results) == [0.0, 1.0, 2.0, 3.0]
        assert all(r.status == OK for r in g.results)
    assert set(stages.cleaned) == stages.started  # queued and in-flight jobs too, after stop
    assert all(n == 1 for n in stages.cleaned.values())
    assert stages.max_running <= 3


def test_hanging_harness_times_out_and_still_goes_through_postrun():
    stages = SimStages()
    svc = make(stages, ["hang"], g=2).start()
    try:
        (group,) = svc.next_groups(1, timeout=30)
    finally:
        svc.stop()
    assert [r.status for r in group.results] == [TIMEOUT, TIMEOUT]
    assert all("RUNNING exceeded" in r.error for r in group.results)
    assert all(stages.partial[r.rollout_id] for r in group.results)


@pytest.mark.parametrize(
    ("task", "stage"), [("crash", "running"), ("evalcrash", "postrun"), ("initfail", "init")]
)
def test_failures_are_recorded_with_stage_and_reason_and_pools_keep_going(task, stage):
    stages = SimStages()
    svc = make(stages, [task, "ok"], g=2).start()
    try:
        bad, good = svc.next_groups(2, timeout=30)
        metrics = svc.metrics()
    finally:
        svc.stop()
    assert all(r.status == FAILED and r.failed_stage == stage and r.error for r in bad.results)
    assert all(r.status == OK for r in good.results)
    assert metrics[f"pool/failures_{stage}"] >= 2
    assert all(n == 1 for n in stages.cleaned.values())


def test_group_deadline_releases_finished_members_and_names_the_missing():
    class Slow(SimStages):
        async def run(self, job):
            if job.member == 1:
                await asyncio.sleep(2)
            await super().run(job)

    sizes = PoolSizes(init=2, ready=2, running=2, postrun=2, run_timeout_s=10)
    svc = make(Slow(), ["x"], g=2, sizes=sizes, group_deadline_s=0.5).start()
    try:
        (group,) = svc.next_groups(1, timeout=30)
    finally:
        svc.stop()
    assert not group.complete
    assert [r.rollout_id for r in group.results] == [f"{group.group_id}-r0"]
    assert group.missing == (f"{group.group_id}-r1",)


def test_backpressure_bounds_work_ahead_of_training():
    stages = SimStages(run_s=0.0)
    svc = make(stages, ["a"], g=2, max_groups_in_flight=2).start()
    try:
        time.sleep(1.0)  # nobody consumes: the feeder must stop at the in-flight bound
        assert len(stages.started) <= 2 * 2
    finally:
        svc.stop()


def test_state_dict_resumes_the_task_cursor():
    stages = SimStages()
    svc = make(stages, ["t0", "t1", "t2", "t3", "t4"], g=2, max_groups_in_flight=2).start()
    try:
        first = svc.next_groups(2, timeout=30)
        state = svc.state_dict()
    finally:
        svc.stop()
    assert [g.task for g in first] == ["t0", "t1"]
    assert state == {"start_seq": 2, "skip_seqs": []}
    resumed = make(SimStages(), ["t0", "t1", "t2", "t3", "t4"], g=2, **state).start()
    try:
        nxt = resumed.next_groups(2, timeout=30)
    finally:
        resumed.stop()
    assert [g.task for g in nxt] == ["t2", "t3"]


def test_empty_task_source_is_a_clear_error():
    with pytest.raises(ValueError, match="task source is empty"):
        make(SimStages(), [])


def test_infrastructure_failures_are_their_own_status_and_counted_by_kind():
    from polar_pl.rollout.pools import INFRA_FAILURE
    from polar_pl.sandbox.infra import InfraError

    class Infra(SimStages):
        async def init(self, job):
            await super().init(job)
            if job.task == "nostart":
                raise InfraError("start", "engine refused the container")

        async def run(self, job):
            if job.task == "hostgone":
                raise InfraError("exec", "the exec stream broke")
            await super().run(job)

    svc = make(Infra(), ["nostart", "hostgone", "ok"], g=2).start()
    try:
        nostart, hostgone, ok = svc.next_groups(3, timeout=30)
        metrics = svc.metrics()
    finally:
        svc.stop()
    assert [(r.status, r.failed_stage, r.info.infra_kind) for r in nostart.results] == [
        (INFRA_FAILURE, "init", "start")] * 2  # fmt: skip
    assert all(r.status == INFRA_FAILURE and r.failed_stage == "running" for r in hostgone.results)
    assert all(r.status == OK for r in ok.results)
    assert metrics["pool/infra_failures/start"] == 2 and metrics["pool/sessions_infra_failure"] == 4


def test_the_service_hands_the_tasks_ahead_of_its_cursor_to_prefetch():
    class Prefetching(SimStages):
        prefetch_depth = 2

        def __init__(self):
            super().__init__()
            self.asked: list[list[str]] = []

        def prefetch(self, tasks):
            self.asked.append(list(tasks))

    stages = Prefetching()
    svc = make(stages, ["a", "b", "c"], g=1, limit=3).start()
    try:
        svc.next_groups(3, timeout=30)
    finally:
        svc.stop()
    assert stages.asked == [["a", "b", "c"], ["b", "c"], ["c"]]  # seq, the next 2, never past limit


def test_stop_returns_while_results_are_arriving():
    """Python 3.11's asyncio.wait_for returns its awaitable's result when the cancellation arrives in
    the loop turn that result does, and the cancellation is lost: the service's collector then polled
    on and stop() timed out (26 of 30 rounds, an evaluation whose rollouts all failed in INIT at once).
    Every round here stops while failures stream in."""
    for _ in range(10):
        svc = make(SimStages(0, 0, 0), ["initfail"], g=2, max_groups_in_flight=4).start()
        try:
            assert svc.next_groups(1, timeout=30)[0].results[0].failed_stage == "init"
        finally:
            svc.stop(timeout=5)


def test_no_groups_in_flight_samples_only_what_the_trainer_waits_for():
    """max_groups_in_flight=0, one stage after another: no group starts while the trainer holds
    its batch (trains and pushes); each `next_groups(n)` starts exactly n."""
    stages = SimStages()
    svc = make(stages, ["a", "b"], g=2, max_groups_in_flight=0).start()
    try:
        time.sleep(0.3)
        assert stages.started == set()  # nothing asked for yet
        assert [g.seq for g in svc.next_groups(2, timeout=30)] == [0, 1]
        time.sleep(0.3)  # "training": the engine idles
        assert len(stages.started) == 4
        assert [g.seq for g in svc.next_groups(1, timeout=30)] == [2]
        time.sleep(0.3)
        assert len(stages.started) == 6
    finally:
        svc.stop()


def test_busy_fractions_stay_within_one_when_snapshots_arrive_late():
    """A full RUNNING pool is busy 100% of every window, however late its metrics snapshot reaches
    the DataModule (a Ray worker's gauges are polled once a second): the window is measured on the
    pool's clock, at the instant the busy time was read. Measured on the reader's clock, a snapshot
    that arrived late before a prompt one gave 1.0006 (the CI failure of stop 35)."""
    pools = StagePools(SimStages(), PoolSizes(running=2))
    for _ in range(2):
        pools.busy["running"].enter()
    fractions = BusyFractions()
    fractions.since_last(pools.metrics())  # the rollouts start
    for late_s in (0.2, 0.0, 0.1, 0.0):
        snapshot = pools.metrics()
        time.sleep(late_s)  # delivered late, then read
        got = fractions.since_last(snapshot)
        assert got["rollout/busy_running"] == pytest.approx(1.0, abs=1e-9)
        assert got["rollout/busy_running"] <= 1.0 + 1e-12
        assert got["rollout/busy_init"] == got["rollout/busy_postrun"] == 0.0
