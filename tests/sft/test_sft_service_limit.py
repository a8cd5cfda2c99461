"""`RolloutService(limit=...)`, added for SFT generation: a bounded run starts no group past its
end, and a resumed one only the groups its log lacks (simulated stages; the pools are not under test)."""

from __future__ import annotations

import time

from polar_pl.rollout.pools import PoolSizes, RolloutJob, RolloutResult
from polar_pl.rollout.service import RolloutService


class Instant:
    """Stages that finish at once and remember which attempts were started."""

    def __init__(self) -> None:
        self.started: list[str] = []

    async def init(self, job: RolloutJob) -> None:
        self.started.append(job.group_id)

    async def run(self, job: RolloutJob) -> None:
        pass

    async def postrun(self, job: RolloutJob) -> RolloutResult:
        return RolloutResult(job.rollout_id, job.group_id, str(job.task), job.status, 1.0)

    async def cleanup(self, job: RolloutJob) -> None:
        pass


def test_only_the_missing_groups_below_the_limit_are_run():
    stages = Instant()
    service = RolloutService(
        stages, ["a", "b"], group_size=2, sizes=PoolSizes(init=2, ready=2, running=2, postrun=2),
        max_groups_in_flight=8, start_seq=1, skip_seqs=[2], limit=5, id_prefix="t",
    ).start()  # fmt: skip
    try:
        groups = service.next_groups(3, timeout=30)
        time.sleep(0.3)  # room to (wrongly) feed seq 5 and beyond
    finally:
        service.stop()
    assert [g.seq for g in groups] == [1, 3, 4]
    assert [g.task for g in groups] == ["b", "b", "a"]
    assert sorted(set(stages.started)) == ["t-g1", "t-g3", "t-g4"]
    assert len(stages.started) == 6  # group_size attempts each, nothing else
