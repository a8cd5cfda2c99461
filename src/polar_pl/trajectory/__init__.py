"""Trajectory builders: trace records of a session -> trainable rows (`merge/` config group)."""

from polar_pl.trajectory.base import (
    FIRST,
    BreakKind,
    BuildResult,
    MergeStats,
    TrajectoryBuilder,
    build_batch,
)
from polar_pl.trajectory.per_request import PerRequestBuilder
from polar_pl.trajectory.prefix import PrefixBuilder

__all__ = [
    "FIRST",
    "BreakKind",
    "BuildResult",
    "MergeStats",
    "PerRequestBuilder",
    "PrefixBuilder",
    "TrajectoryBuilder",
    "build_batch",
]
