"""Fail fast and say why (issue 27): a run whose first rollouts all fail the same way stops with
that failure, and a trainer waiting for rollouts prints what it waits on.

The run that prompted it: every sandbox failed to start ("bwrap: Can't find source path"); each
group came back without rows, `next_batch` drew the next one, and the run spun at 80% CPU for
minutes with no line after the first rollout's. The rollout client here is a stub handing out
prepared groups (tests/test_train.py runs the real thing end to end)."""

from __future__ import annotations

import logging
import time

import pytest

from polar_pl.datamodule.datamodule import RolloutDataModule
from polar_pl.datamodule.failfast import FailFast, RolloutsFailing
from polar_pl.errors import RunFailed
from polar_pl.rollout.pools import (
    FAILED,
    HARNESS_ERROR,
    INFRA_FAILURE,
    OK,
    TIMEOUT,
    AttemptInfo,
    RolloutResult,
)
from polar_pl.rollout.runtime import RolloutRuntime
from polar_pl.rollout.service import Group
from polar_pl.trajectory.rows import TrajectoryRow

BWRAP = "RuntimeError: baseline commit failed: bwrap: Can't find source path /x/.cache/harness"


class Version:
    urls: list[str] = []  # Engine.urls: no server to read counters from

    def policy_version(self) -> int:
        return 0


class Prepared:
    """A rollout client handing out prepared groups; it refuses to be asked past its last one (a
    trainer that never stops asking would otherwise spin here, as the real run did)."""

    def __init__(self, groups: list[Group], waits: int = 0, metrics: dict[str, float] | None = None) -> None:
        self.groups, self.waits, self._metrics = list(groups), waits, metrics or {}
        self.asked = 0

    def start_groups(self, cursor) -> None:
        pass

    def next_groups(self, n, timeout=None, *, consume=True):
        if self.waits:  # nothing ready within this wait
            self.waits -= 1
            time.sleep(timeout)
            raise TimeoutError("nothing ready")
        if not self.groups:
            raise AssertionError("asked for a group past the last one: the trainer did not stop")
        out, self.groups = self.groups[:n], self.groups[n:]
        return out

    def metrics(self) -> dict[str, float]:
        return self._metrics

    def last_failure(self) -> str | None:
        return f"init: {BWRAP}"


def result(
    k: int, status: str = FAILED, error: str | None = BWRAP, stage: str | None = "init", **info
) -> RolloutResult:
    rows = (
        (TrajectoryRow([1, 2], [0, 1], [0.0, -1.0], [-1, 0], f"r{k}", f"r{k}", "g", 0.5),)
        if status == OK
        else ()
    )
    return RolloutResult(f"r{k}", "g", "t", status, 0.5 if status == OK else 0.0, rows=rows, error=error,
                         failed_stage=stage, info=AttemptInfo(**info))  # fmt: skip


def groups(results: list[RolloutResult], size: int) -> list[Group]:
    return [
        Group(f"g{i}", i, None, tuple(results[i * size : (i + 1) * size]))
        for i in range(len(results) // size)
    ]


def datamodule(client: Prepared, group_size: int = 4, **kw) -> RolloutDataModule:
    runtime = RolloutRuntime(
        engine=Version(), sandbox=None, harness=None, tasks=[None], evaluator=None, builder=None,
        group_size=group_size, progress=False,
    )  # fmt: skip
    runtime.client = client
    return RolloutDataModule(runtime=runtime, steps=1, groups_per_step=1, **kw)


def test_a_run_whose_first_group_all_failed_alike_stops_with_that_failure() -> None:
    dm = datamodule(Prepared(groups([result(k) for k in range(12)], 4)))
    with pytest.raises(RolloutsFailing) as stopped:
        dm.next_batch()
    assert isinstance(stopped.value, RunFailed)  # train.py prints it as the run's last line
    assert str(stopped.value).endswith(BWRAP) and "first 4 rollouts" in str(stopped.value)


def test_fail_fast_after_counts_rollouts_across_groups() -> None:
    dm = datamodule(Prepared(groups([result(k) for k in range(12)], 2)), group_size=2, fail_fast_after=6)
    with pytest.raises(RolloutsFailing, match="first 6 rollouts"):
        dm.next_batch()
    assert dm.runtime.client.groups == groups([result(k) for k in range(12)], 2)[3:]  # stopped at the 6th


def test_a_run_that_worked_once_is_never_stopped() -> None:
    first = [result(0, OK, None, None), *[result(k) for k in range(1, 4)]]
    dm = datamodule(Prepared(groups(first + [result(k) for k in range(4, 12)], 4)))
    dm.next_batch()  # the failed groups after the first are the run's business, not fail-fast's


def test_failures_that_differ_do_not_stop_it_and_zero_turns_it_off() -> None:
    mixed = [result(0), result(1, INFRA_FAILURE, "InfraError: image pull failed", "init", infra_kind="image"),
             result(2), result(3), result(4, OK, None, None)]  # fmt: skip
    datamodule(Prepared([Group("g", 0, None, tuple(mixed))]), group_size=5).next_batch()
    off = datamodule(Prepared([*groups([result(k) for k in range(8)], 4), Group("g", 2, None, (result(9, OK, None, None),))]),
                     fail_fast_after=0)  # fmt: skip
    off.next_batch()


def test_what_counts_as_the_same_infrastructure_failure() -> None:
    """Same stage and exception type (messages may differ in a temporary path); a harness error
    counts when the records blame the harness or the engine, never a policy-caused one or a timeout."""
    watch = FailFast(3)
    watch.see(
        [
            result(0, error="FileNotFoundError: '/x/polar-sbx-a1'"),
            result(1, error="FileNotFoundError: '/x/polar-sbx-b2'"),
        ]
    )
    with pytest.raises(RolloutsFailing, match="polar-sbx-c3"):
        watch.see([result(2, error="FileNotFoundError: '/x/polar-sbx-c3'")])
    for not_infra in (result(0, TIMEOUT, "RUNNING exceeded 300s", None),
                      result(0, HARNESS_ERROR, "exit 3: out of turns", None, harness_error="policy")):  # fmt: skip
        watch = FailFast(1)
        watch.see([not_infra])
        assert not watch.watching
    with pytest.raises(RolloutsFailing):
        FailFast(1).see([result(0, HARNESS_ERROR, "exit 127: node: not found", None, harness_error="infra")])
    with pytest.raises(ValueError, match="datamodule.fail_fast_after"):
        FailFast(-1)


def test_a_trainer_waiting_for_rollouts_says_what_it_waits_on(caplog) -> None:
    gauges = {"pool/init_active": 1, "pool/running_active": 2, "pool/postrun_active": 0,
              "pool/sessions_ok": 3, "pool/sessions_failed": 5}  # fmt: skip
    good = groups([result(k, OK, None, None) for k in range(4)], 4)
    dm = datamodule(Prepared(good, waits=2, metrics=gauges), wait_log_s=0.2)
    with caplog.at_level(logging.INFO, logger="polar_pl.datamodule.datamodule"):
        dm.next_batch()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting")]
    assert len(lines) == 2, lines
    assert (
        "for batch 1/1: rollouts 3 in progress (init 1, running 2, postrun 0), 8 finished (failed 5, ok 3), 5 failed"
        in lines[0]
    )
    assert lines[0].endswith(f"last failure: init: {BWRAP}")
