"""Hand-built trajectory rows for the module tests: ragged rows, rollouts split into several
chains, side rows, unequal groups, and per-call metadata as the builders record it."""

from __future__ import annotations

from collections.abc import Sequence

from polar_pl.trajectory.rows import TrajectoryRow


def row(
    rollout: str,
    group: str,
    reward: float,
    spans: Sequence[tuple[int, int]],
    length: int,
    *,
    side: bool = False,
    ids: Sequence[int] | None = None,
    behavior: float | Sequence[float] = -1.0,
    sampling: Sequence[dict] | None = None,
    finish: Sequence[str | None] | None = None,
    version: int = 0,
    harness: str = "mini",
) -> TrajectoryRow:
    """A row of `length` tokens whose calls sampled the [start, end) `spans` (prompt and glue
    masked), with per-call meta (`calls`) as make_row records it."""
    mask = [0] * length
    for a, b in spans:
        mask[a:b] = [1] * (b - a)
    beh = [behavior] * length if isinstance(behavior, int | float) else list(behavior)
    calls = [
        {
            "start": a,
            "finish_reason": (finish or [None] * len(spans))[i],
            "sampling": (sampling or [{}] * len(spans))[i],
        }
        for i, (a, _) in enumerate(spans)
    ]
    return TrajectoryRow(
        input_ids=list(ids)
        if ids is not None
        else [(7 * i + 13 * sum(map(ord, rollout))) % 40 + 1 for i in range(length)],
        loss_mask=mask,
        behavior_logprobs=[b if m else 0.0 for b, m in zip(beh, mask, strict=True)],
        policy_version=[version if m else -1 for m in mask],
        session_id=rollout,
        rollout_id=rollout,
        group_id=group,
        reward=reward,
        harness=harness,
        meta={"call_kind": "side" if side else "main", "calls": calls},
    )


def mixed_rows() -> list[TrajectoryRow]:
    """Two groups of unequal size. Group a: rollout a0 split into two chains (2 + 1 calls) plus a
    side row (a title call, reward 0), a1 one chain, a2 one chain. Group b: b0, b1 (ragged)."""
    return [
        row("a0", "a", 1.0, [(2, 4), (6, 8)], 9),
        row("a0", "a", 1.0, [(3, 6)], 7),
        row("a0", "a", 0.0, [(2, 5)], 5, side=True),
        row("a1", "a", 0.0, [(1, 3), (5, 6), (8, 11)], 12),
        row("a2", "a", 0.5, [(2, 3)], 4),
        row("b0", "b", 1.0, [(3, 9)], 10),
        row("b1", "b", 0.0, [(1, 2)], 3),
    ]
