"""`per_request` builder: one row per model call, prompt masked, sampled tokens trainable.

The baseline every other builder is measured against: nothing is merged, so nothing can be merged
wrongly, and the compression ratio is 1 by definition.
"""

from __future__ import annotations

from collections.abc import Sequence

from polar_pl.gateway.store.records import TraceRecord
from polar_pl.trajectory.base import (
    BuildResult,
    MergeStats,
    SideCallOptions,
    make_row,
    prepare,
    spliced,
)
from polar_pl.trajectory.rows import TrajectoryRow


class PerRequestBuilder(SideCallOptions):
    """One row per call.

    include_side_calls: emit rows for calls the gateway tagged "side" (titles, memory, routing).
    side_calls_inherit_reward: give side rows the rollout's reward; otherwise they get side_reward.
    """

    name = "per_request"

    def build(
        self,
        records: Sequence[TraceRecord],
        *,
        reward: float = 0.0,
        status: str = "ok",
        harness: str | None = None,
    ) -> BuildResult:
        calls = prepare(records)
        rows: list[TrajectoryRow] = []
        skipped = call_tokens = 0
        for c in calls:
            side = c.rec.call_kind == "side"
            if c.skipped or (side and not self.include_side_calls):
                skipped += 1
                continue
            r = self.side_reward if side and not self.side_calls_inherit_reward else reward
            rows.append(make_row([c], reward=r, status=status, harness=harness, meta={}))
            call_tokens += c.num_tokens
        stats = MergeStats(
            sessions=1 if calls else 0,
            calls=len(calls),
            skipped_calls=skipped,
            rows=len(rows),
            call_tokens=call_tokens,
            row_tokens=sum(len(r.input_ids) for r in rows),
            sampled_tokens=sum(r.num_trainable for r in rows),
            spliced_calls=sum(spliced(c) for c in calls),
        )
        return BuildResult(rows, stats)
