"""pass@k over n samples per task, with 95% intervals, and the paired difference of two models.

For a task with n valid samples of which c passed, pass@k is the unbiased estimator of Chen et al.
(2021), 1 - C(n - c, k) / C(n, k): the chance that at least one of k samples drawn without
replacement passes. A task set's pass@k is the mean over its tasks. Its 95% interval treats tasks
as the unit of sampling (samples of one task are not independent of each other): mean ± 1.96
standard errors of the per-task values (normal approximation; 300 tasks make it a fair one).

Two models on the same tasks are compared task by task: d_i = pass@1_i(B) - pass@1_i(A), and the
interval of the mean of d_i is the same task-level one. Pairing removes the spread of task
difficulty from the comparison, which makes it much tighter than two separate intervals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Z95 = 1.959964


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with n samples, c of which passed (needs n >= k)."""
    if not 0 <= c <= n or k < 1 or n < k:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A mean over tasks with its 95% interval (`low`, `high`) and the number of tasks."""

    mean: float
    low: float
    high: float
    tasks: int

    @classmethod
    def of(cls, values: Sequence[float], bounds: tuple[float, float] = (0.0, 1.0)) -> Estimate:
        """The mean of `values` and its interval, clipped to `bounds` (what the quantity can be)."""
        n = len(values)
        if n == 0:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        mean = sum(values) / n
        var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
        half = Z95 * math.sqrt(var / n)
        return cls(mean, max(bounds[0], mean - half), min(bounds[1], mean + half), n)

    def __str__(self) -> str:
        return f"{100 * self.mean:.1f} [{100 * self.low:.1f}, {100 * self.high:.1f}]"

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "tasks": self.tasks}


def per_task(counts: Mapping[str, tuple[int, int]], k: int) -> dict[str, float]:
    """pass@k of every task with at least k valid samples; counts: task id -> (n, c)."""
    return {t: pass_at_k(n, c, k) for t, (n, c) in counts.items() if n >= k}


def summarize(counts: Mapping[str, tuple[int, int]], ks: Sequence[int]) -> dict[int, Estimate]:
    """pass@k for each k in `ks` over the tasks that have k valid samples."""
    return {k: Estimate.of(list(per_task(counts, k).values())) for k in ks}


def paired(a: Mapping[str, float], b: Mapping[str, float]) -> Estimate:
    """Mean of b - a over the tasks both have, with its task-level 95% interval."""
    common = sorted(set(a) & set(b))
    return Estimate.of([b[t] - a[t] for t in common], bounds=(-1.0, 1.0))
