"""The rollout metrics of one training batch: rewards, failures by kind, session stage times, merge
statistics, and the busy fractions of the engine and of each stage pool since the last batch."""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol

from polar_pl.rollout.pools import INFRA_FAILURE, RolloutResult
from polar_pl.rollout.service import Group
from polar_pl.trajectory import MergeStats
from polar_pl.trajectory.rows import TrajectoryRow

STAGES = ("init", "running", "postrun")


class BatchShape(Protocol):
    """What the metrics read of a collated batch (datamodule.collate.TrainBatch)."""

    @property
    def padding_waste(self) -> float: ...

    @property
    def shared_tokens(self) -> int: ...

    @property
    def total_tokens(self) -> int: ...


def infra_kind(result: RolloutResult) -> str | None:
    """The infrastructure failure of an attempt: a sandbox one (its kind), a harness error the
    records blame on the engine or gateway ("harness"), or None (the policy's own attempt)."""
    if result.status == INFRA_FAILURE:
        return result.info.infra_kind or "unknown"
    if result.info.harness_error == "infra":
        return "harness"
    return None


def batch_metrics(
    groups: Sequence[Group],
    rows: Sequence[TrajectoryRow],
    batch: BatchShape,
    wait_s: float,
    counters: Mapping[str, int],
) -> dict[str, float]:
    """rollout/*, time/session_*, merge/* and datamodule/* (the DataModule's counters) of a batch."""
    every = [r for g in groups for r in g.results]
    # infrastructure failures say nothing about the policy: out of the reward statistics
    results = [r for r in every if infra_kind(r) is None]
    rewards = [r.reward for r in results]
    infra = Counter(k for r in every if (k := infra_kind(r)) is not None)
    m: dict[str, float] = {
        "rollout/infra_failures": float(sum(infra.values())),
        **{f"rollout/infra_failures/{kind}": float(n) for kind, n in infra.items()},
        "rollout/reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "rollout/pass_rate": sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else 0.0,
        # this process (trainer; in thread mode also the engine and the gateway), in MiB
        "sys/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        # share of attempts the evaluator caught reaching for the evaluation itself (reward 0)
        "rollout/tampering": (
            sum(r.info.eval_status == "tampering" for r in results) / len(results) if results else 0.0
        ),
        "rollout/sessions": len(every),
        "rollout/masked": sum(r.info.masked for r in every),
        "rollout/harness_error_policy": sum(r.info.harness_error == "policy" for r in every),
        "rollout/harness_error_infra": sum(r.info.harness_error == "infra" for r in every),
        "rollout/rows": len(rows),
        "rollout/trainable_tokens": sum(r.num_trainable for r in rows),
        "rollout/wait_s": wait_s,
        "rollout/padding_waste": batch.padding_waste,
        # collate_mode tree: row tokens laid out once for several rows (a group's shared prompt)
        "rollout/shared_token_frac": batch.shared_tokens / max(batch.shared_tokens + batch.total_tokens, 1),
    }
    for stage in STAGES:  # per session, mean over the batch
        spent = [r.timings[stage] for r in results if stage in r.timings]
        if spent:
            m[f"time/session_{stage}_s"] = sum(spent) / len(spent)
    by_check: dict[str, list[float]] = {}
    for g in groups:  # per answer check: a task family that mixes kinds shows each one
        check = getattr(
            getattr(g.task, "answer_check", None), "kind", None
        )  # a remote group's task is its id
        if check:
            by_check.setdefault(check, []).extend(r.reward for r in g.results)
    m.update({f"rollout/reward_by_check/{k}": sum(v) / len(v) for k, v in by_check.items() if v})
    if len(rewards) > 1:
        mean = m["rollout/reward_mean"]
        m["rollout/reward_std"] = (sum((x - mean) ** 2 for x in rewards) / (len(rewards) - 1)) ** 0.5
    # Counts add up over sessions; ratios are recomputed from the sums (a sum of per-session
    # ratios logged 8.0 for eight sessions whose true compression ratio was 1.0).
    stats = [MergeStats.from_metrics(r.info.merge) for r in results if r.info.merge]
    if stats:
        m.update({k: float(v) for k, v in sum(stats, MergeStats()).to_metrics("merge").items()})
    m.update({f"datamodule/{k}": float(v) for k, v in counters.items()})
    return m


# each busy fraction: (its cumulative busy seconds, the uptime read on the same clock)
_BUSY_WINDOWS = {
    "rollout/engine_busy": ("gateway/engine_busy_s", "gateway/uptime_s"),
    **{f"rollout/busy_{s}": (f"pool/{s}_busy_s", "pool/uptime_s") for s in STAGES},
}


class BusyFractions:
    """rollout/engine_busy and rollout/busy_<stage>: the share of time since the last batch that the
    engine served calls and each stage pool had work, from the rollout client's cumulative
    `gateway/engine_busy_s`, `gateway/uptime_s`, `pool/<stage>_busy_s` and `pool/uptime_s`.
    Each fraction's window is measured on the clock its busy time was read on (a snapshot read
    later than its pool's clock would otherwise give fractions above 1)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}  # the cumulative counters at the last batch

    def since_last(self, client: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, (busy_key, clock_key) in _BUSY_WINDOWS.items():
            if busy_key not in client or clock_key not in client:
                continue
            span = client[clock_key] - self._last.get(clock_key, 0.0)
            if span > 0:
                out[name] = (client[busy_key] - self._last.get(busy_key, 0.0)) / span
        self._last.update({k: client[k] for pair in _BUSY_WINDOWS.values() for k in pair if k in client})
        return out
