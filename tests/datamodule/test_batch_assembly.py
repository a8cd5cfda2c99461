"""Batch assembly in RolloutDataModule.next_batch on released groups: staleness decided per
rollout or per group (never a rollout missing one chain), DAPO dynamic sampling refilling a
batch whose groups have no reward variance. The rollout service (not under test here) is a
queue of prepared groups; the engine only reports its policy version."""

from __future__ import annotations

from polar_pl.datamodule.datamodule import RolloutDataModule
from polar_pl.rollout.pools import OK, AttemptInfo, RolloutResult
from polar_pl.rollout.runtime import RolloutRuntime
from polar_pl.rollout.service import Group
from polar_pl.trajectory.rows import TrajectoryRow


class Version:
    urls: list[str] = []  # Engine.urls: no server to read counters from

    def __init__(self, version: int) -> None:
        self.version = version

    def policy_version(self) -> int:
        return self.version


class Released:
    """A rollout client (`RolloutClient`) handing out prepared groups in order, as
    RolloutService.next_groups does; the datamodule calls start_groups before the first batch."""

    def __init__(self, groups: list[Group]) -> None:
        self.groups = list(groups)
        self.cursor: dict | None = None

    def start_groups(self, cursor):
        self.cursor = cursor

    def next_groups(self, n, timeout=None, *, consume=True):
        out, self.groups = self.groups[:n], self.groups[n:]
        return out

    def metrics(self):
        return {}


def chain(rollout: str, reward: float, version: int) -> TrajectoryRow:
    return TrajectoryRow(
        [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [-1, version, version], rollout, rollout, "g", reward
    )


def group(seq: int, rewards: list[float], versions: list[list[int]] | None = None) -> Group:
    """One result per reward; result k has one chain per entry of versions[k] (default one at 0)."""
    versions = versions or [[0]] * len(rewards)
    results = tuple(
        RolloutResult(
            f"g{seq}-r{k}", f"g{seq}", "t", OK, r, rows=tuple(chain(f"g{seq}-r{k}", r, v) for v in vs)
        )
        for k, (r, vs) in enumerate(zip(rewards, versions, strict=True))
    )
    return Group(f"g{seq}", seq, None, results)


def datamodule(groups: list[Group], version: int = 0, **kw) -> RolloutDataModule:
    runtime = RolloutRuntime(
        engine=Version(version), sandbox=None, harness=None, tasks=[None], evaluator=None, builder=None,
        progress=False,
    )  # fmt: skip
    runtime.client = Released(groups)
    return RolloutDataModule(runtime=runtime, steps=1, **kw)


def test_stale_rollout_is_dropped_whole() -> None:
    """A rollout whose second chain is stale loses both chains (it used to lose one, and its
    group baseline was computed on the half that survived)."""
    g = group(0, [1.0, 0.0, 0.5], versions=[[2, 0], [2], [2]])
    dm = datamodule([g], version=2, max_staleness=1, groups_per_step=1)
    rows = dm._fresh_rows([g])
    assert sorted({r.rollout_id for r in rows}) == ["g0-r1", "g0-r2"] and len(rows) == 2
    assert (dm.counters["rollouts_stale_dropped"], dm.counters["rows_stale_dropped"]) == (1, 2)


def test_stale_group_is_dropped_whole_by_config() -> None:
    g = group(0, [1.0, 0.0], versions=[[0], [2]])
    dm = datamodule(
        [g, group(1, [1.0, 0.0], [[2], [2]])],
        version=2,
        max_staleness=1,
        groups_per_step=1,
        stale_unit="group",
    )
    assert dm._fresh_rows([g]) == [] and dm.counters["groups_stale_dropped"] == 1
    batch = dm.next_batch()  # the stale group is replaced by the next one
    assert batch.group_ids == ["g"] and batch.num_rows == 2 and dm.last_metrics["rollout/groups_drawn"] == 2.0


def test_dynamic_sampling_refills_groups_without_signal() -> None:
    groups = [group(0, [1.0, 1.0]), group(1, [0.0, 1.0]), group(2, [0.0, 0.0]), group(3, [0.5, 1.0])]
    dm = datamodule(groups, groups_per_step=2, dynamic_sampling=True)
    batch = dm.next_batch()
    assert [m["rollout_id"] for m in batch.row_meta] == ["g1-r0", "g1-r1", "g3-r0", "g3-r1"]
    assert dm.counters["groups_without_signal"] == 2 and dm._issued[0] == [0, 1, 2, 3]
    assert dm.last_metrics["rollout/groups_drawn"] == 4.0
    assert dm.last_metrics["rollout/reward_mean"] == 4.5 / 8  # every drawn rollout: the honest mean


def test_dynamic_sampling_gives_up_after_max_groups_drawn() -> None:
    flat = [group(k, [1.0, 1.0]) for k in range(5)]
    dm = datamodule(flat, groups_per_step=1, dynamic_sampling=True, max_groups_drawn=3)
    batch = dm.next_batch()  # nothing with signal within 3 draws: the step trains nothing (GRPO skips it)
    assert dm._issued[0] == [0, 1, 2] and batch.num_rows == 6
    plain = datamodule([group(k, [1.0, 1.0]) for k in range(2)], groups_per_step=1)
    assert plain.next_batch().num_rows == 2 and plain._issued[0] == [0]  # off: zero-variance groups pass


def test_merge_metrics_of_a_batch_come_from_summed_counts() -> None:
    """Each result carries its session's merge counts; the batch's ratios are recomputed from the
    sums (MergeStats.from_metrics, lost once in a merge: next_batch raised AttributeError)."""
    from dataclasses import replace

    from polar_pl.trajectory import MergeStats

    one = MergeStats(sessions=1, calls=4, rows=2, call_tokens=300, row_tokens=200, breaks={"side_call": 1})
    assert MergeStats.from_metrics(one.to_metrics()) == one
    g = group(0, [1.0, 0.0])
    g = replace(g, results=tuple(replace(r, info=AttemptInfo(merge=one.to_metrics())) for r in g.results))
    dm = datamodule([g], groups_per_step=1)
    dm.next_batch()
    m = dm.last_metrics
    assert (m["merge/calls_per_row"], m["merge/compression_ratio"], m["merge/sessions"]) == (2.0, 1.5, 2.0)
