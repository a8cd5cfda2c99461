"""A `TaskQueue` feed (POST /v1/tasks): each submitted task becomes exactly one group, in order,
submitted before or while the service runs; nothing cycles. Simulated stages (not under test)."""

from __future__ import annotations

import pickle

import pytest
from rollout_kit import SleepStages

from polar_pl.rollout.pools import PoolSizes
from polar_pl.rollout.service import RolloutService
from polar_pl.rollout.tasks import TaskQueue


def test_each_submitted_task_is_one_group_in_order():
    queue = TaskQueue(["a"])
    svc = RolloutService(
        SleepStages(0.01), queue, group_size=2, sizes=PoolSizes(), max_groups_in_flight=4
    ).start()
    try:
        (first,) = svc.next_groups(1, timeout=30)
        assert (first.seq, first.task, len(first.results)) == (0, "a", 2)
        with pytest.raises(TimeoutError):
            svc.next_groups(1, timeout=0.5)  # nothing submitted: nothing runs (no cycling)
        assert queue.put(["b", "c"]) == [1, 2]
        got = svc.next_groups(2, timeout=30)
    finally:
        svc.stop()
    assert [(g.seq, g.task) for g in got] == [(1, "b"), (2, "c")]
    assert pickle.loads(pickle.dumps(queue))[2] == "c"  # travels to a Ray controller
