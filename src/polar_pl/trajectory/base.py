"""The trajectory-builder contract, chain-break kinds and merge statistics.

A builder turns one session's trace records into trajectory rows. Builders are chosen by the Hydra
group `merge/` (`_target_`), and every builder reports the same `MergeStats`, so runs with
different builders can be compared in one table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from polar_pl.gateway.store.chains import FIRST, BreakKind  # noqa: F401 (FIRST: re-exported for the builders)
from polar_pl.gateway.store.packed import as_i32
from polar_pl.gateway.store.records import TraceRecord
from polar_pl.trajectory.rows import TrajectoryRow


@dataclass(frozen=True, slots=True)
class MergeStats:
    """Counts for one session or, summed with `+`, for a batch.

    calls: records seen. skipped_calls: failed calls with nothing sampled (no row, no tokens).
    rows: rows emitted (chains for `prefix`, calls for `per_request`).
    call_tokens: sum over merged calls of prompt + response tokens, i.e. what `per_request` trains on.
    row_tokens: sum of row lengths, what this builder's rows make the trainer process.
    sampled_tokens: tokens with loss_mask 1 (identical under every builder).
    spliced_calls: calls whose prompt differed from the plain re-render (token-faithful splicing).
    breaks: chain breaks by `BreakKind` value.

    compression_ratio = call_tokens / row_tokens (1.0 for per_request; higher is less recompute).
    """

    sessions: int = 0
    calls: int = 0
    skipped_calls: int = 0
    rows: int = 0
    call_tokens: int = 0
    row_tokens: int = 0
    sampled_tokens: int = 0
    spliced_calls: int = 0
    breaks: Mapping[str, int] = field(default_factory=dict)

    @property
    def compression_ratio(self) -> float:
        return self.call_tokens / self.row_tokens if self.row_tokens else 1.0

    @property
    def calls_per_row(self) -> float:
        merged = self.calls - self.skipped_calls
        return merged / self.rows if self.rows else 0.0

    @property
    def num_breaks(self) -> int:
        return sum(self.breaks.values())

    def __add__(self, other: MergeStats) -> MergeStats:
        breaks = dict(self.breaks)
        for k, v in other.breaks.items():
            breaks[k] = breaks.get(k, 0) + v
        return MergeStats(
            sessions=self.sessions + other.sessions,
            calls=self.calls + other.calls,
            skipped_calls=self.skipped_calls + other.skipped_calls,
            rows=self.rows + other.rows,
            call_tokens=self.call_tokens + other.call_tokens,
            row_tokens=self.row_tokens + other.row_tokens,
            sampled_tokens=self.sampled_tokens + other.sampled_tokens,
            spliced_calls=self.spliced_calls + other.spliced_calls,
            breaks=breaks,
        )

    def to_metrics(self, prefix: str = "merge") -> dict[str, float]:
        """Flat slash-keyed metrics (`merge/calls`, `merge/breaks/drift`, ...), every kind present."""
        out: dict[str, float] = {
            f"{prefix}/sessions": self.sessions,
            f"{prefix}/calls": self.calls,
            f"{prefix}/skipped_calls": self.skipped_calls,
            f"{prefix}/rows": self.rows,
            f"{prefix}/call_tokens": self.call_tokens,
            f"{prefix}/row_tokens": self.row_tokens,
            f"{prefix}/sampled_tokens": self.sampled_tokens,
            f"{prefix}/spliced_calls": self.spliced_calls,
            f"{prefix}/compression_ratio": self.compression_ratio,
            f"{prefix}/calls_per_row": self.calls_per_row,
        }
        for kind in BreakKind:
            out[f"{prefix}/breaks/{kind.value}"] = self.breaks.get(kind.value, 0)
        return out

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float], prefix: str = "merge") -> MergeStats:
        """The counts back from `to_metrics` (the ratios are derived, so they are not read)."""
        counts = {
            f: int(metrics.get(f"{prefix}/{f}", 0))
            for f in (
                "sessions",
                "calls",
                "skipped_calls",
                "rows",
                "call_tokens",
                "row_tokens",
                "sampled_tokens",
                "spliced_calls",
            )
        }
        breaks = {
            k.removeprefix(f"{prefix}/breaks/"): int(v)
            for k, v in metrics.items()
            if k.startswith(f"{prefix}/breaks/") and v
        }
        return cls(**counts, breaks=breaks)


@dataclass(frozen=True, slots=True)
class BuildResult:
    """Rows of one session (or a batch) and their statistics."""

    rows: list[TrajectoryRow]
    stats: MergeStats


class SideCallOptions:
    """What every builder does with side calls (titles, memory, routing).

    include_side_calls: emit rows for them (never merged into task chains).
    side_calls_inherit_reward: give side rows the rollout's reward; otherwise they get side_reward.
    """

    def __init__(
        self,
        include_side_calls: bool = True,
        side_calls_inherit_reward: bool = False,
        side_reward: float = 0.0,
    ) -> None:
        self.include_side_calls = include_side_calls
        self.side_calls_inherit_reward = side_calls_inherit_reward
        self.side_reward = side_reward


@runtime_checkable
class TrajectoryBuilder(Protocol):
    """Turns the trace records of one finished session into trainable rows."""

    name: str

    def build(
        self,
        records: Sequence[TraceRecord],
        *,
        reward: float = 0.0,
        status: str = "ok",
        harness: str | None = None,
    ) -> BuildResult:
        """Called once per session in POSTRUN, after the reward is known.

        records: all records of one session, any order (sorted by call_index here).
        reward: the rollout's reward, given to every task row (side rows per builder config).
        status: the session status (ok / timeout / error) copied onto each row.
        Raises ValueError on a malformed record (mismatched lengths, mixed sessions).
        """
        ...


def build_batch(
    builder: TrajectoryBuilder,
    records: Iterable[TraceRecord],
    rewards: Mapping[str, float] | None = None,
    statuses: Mapping[str, str] | None = None,
) -> BuildResult:
    """Group records by session and build each; rewards/statuses are keyed by session id."""
    by_session: dict[str, list[TraceRecord]] = {}
    for rec in records:
        by_session.setdefault(rec.session_id, []).append(rec)
    rows: list[TrajectoryRow] = []
    stats = MergeStats()
    for sid, recs in by_session.items():
        res = builder.build(
            recs,
            reward=(rewards or {}).get(sid, 0.0),
            status=(statuses or {}).get(sid, "ok"),
        )
        rows.extend(res.rows)
        stats = stats + res.stats
    return BuildResult(rows, stats)


# --- helpers shared by the builders ------------------------------------------------------------


class Call:
    """One record prepared for merging: token ids as int32 arrays, and their bytes, so prefix
    checks are memcmp (zero-copy for records read packed from the store)."""

    __slots__ = ("num_tokens", "pos", "prompt", "prompt_bytes", "rec", "response", "response_bytes")

    def __init__(self, rec: TraceRecord, pos: int) -> None:
        self.rec = rec
        self.pos = pos
        self.prompt = as_i32(rec.prompt_ids)
        self.response = as_i32(rec.response_ids)
        self.prompt_bytes = _bytes(self.prompt)
        self.response_bytes = _bytes(self.response)
        n = len(self.response)
        self.num_tokens = len(self.prompt) + n
        if len(rec.response_logprobs) != n:
            raise ValueError(
                f"session {rec.session_id} call {rec.call_index}: {n} response_ids but "
                f"{len(rec.response_logprobs)} response_logprobs"
            )
        if rec.response_policy_versions is not None and len(rec.response_policy_versions) != n:
            raise ValueError(
                f"session {rec.session_id} call {rec.call_index}: {n} response_ids but "
                f"{len(rec.response_policy_versions)} response_policy_versions"
            )

    @property
    def ok(self) -> bool:
        return self.rec.status == "ok"

    @property
    def skipped(self) -> bool:
        """A failed call that sampled nothing carries nothing trainable."""
        return self.rec.status != "ok" and len(self.response) == 0

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(prompt, response) as int32 arrays."""
        return self.prompt, self.response


def _bytes(a: np.ndarray) -> bytes:
    """The array's bytes: its own buffer when it is a whole blob read from the store."""
    base = a.base
    if isinstance(base, bytes) and len(base) == a.nbytes and a.flags.c_contiguous:
        return base
    return a.tobytes()


def prepare(records: Sequence[TraceRecord]) -> list[Call]:
    """Records of one session in call order, validated."""
    if not records:
        return []
    sid = records[0].session_id
    for rec in records:
        if rec.session_id != sid:
            raise ValueError(f"records of several sessions given to one build: {sid!r}, {rec.session_id!r}")
    ordered = sorted(records, key=lambda r: r.call_index)
    return [Call(rec, i) for i, rec in enumerate(ordered)]


def make_row(
    calls: Sequence[Call],
    *,
    reward: float,
    status: str,
    harness: str | None,
    meta: dict[str, Any],
) -> TrajectoryRow:
    """The row of a chain: the last call's prompt + response, loss on every call's sampled span.
    meta["calls"] lists, per call that sampled tokens, where its span starts in the row, its
    finish reason and its sampling settings (the trainer's per-call segments, module/segments.py).

    Every earlier call's prompt + response is a token prefix of the last call's prompt (the chain
    invariant), so call i's sampled tokens sit at [len(prompt_i), len(prompt_i) + len(response_i)).
    """
    fields: Any  # lists or arrays, both taken by TrajectoryRow (rows.py)
    if type(calls[-1].rec.prompt_ids) is list:  # records built in memory: rows as lists
        fields = _list_fields(calls)
    else:
        fields = _array_fields(calls)
    input_ids, mask, logprobs, versions = fields
    first = calls[0].rec
    sampled = [
        {"start": len(c.prompt), "finish_reason": c.rec.finish_reason, "sampling": call_sampling(c.rec)}
        for c in calls
        if len(c.response)
    ]
    return TrajectoryRow(
        input_ids=input_ids,
        loss_mask=mask,
        behavior_logprobs=logprobs,
        policy_version=versions,
        session_id=first.session_id,
        rollout_id=first.rollout_id or first.session_id,
        group_id=first.group_id or first.task_id or first.session_id,
        reward=reward,
        call_indices=tuple(c.rec.call_index for c in calls),
        harness=harness,
        status=status,
        meta={"call_kind": first.call_kind, "num_calls": len(calls), "calls": sampled, **meta},
    )


def _array_fields(calls: Sequence[Call]) -> tuple[np.ndarray, ...]:
    """input_ids, loss_mask, logprobs, versions as arrays (records read packed: no conversion)."""
    last = calls[-1]
    n = last.num_tokens
    input_ids = np.concatenate([last.prompt, last.response])
    mask = np.zeros(n, dtype=np.int32)
    logprobs = np.zeros(n, dtype=np.float64)
    versions = np.full(n, -1, dtype=np.int32)
    for c in calls:
        start, end = len(c.prompt), len(c.prompt) + len(c.response)
        mask[start:end] = 1
        logprobs[start:end] = c.rec.response_logprobs
        v = c.rec.response_policy_versions
        versions[start:end] = c.rec.policy_version if v is None else v
    return input_ids, mask, logprobs, versions


def _list_fields(calls: Sequence[Call]) -> tuple[list, ...]:
    """The same as lists, with list operations: the record lists are reused, never converted
    (array -> list conversion of every row made per_request merging ~4x slower)."""
    last = calls[-1].rec
    assert isinstance(last.prompt_ids, list)  # make_row's check
    mask: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    for c in calls:
        gap = len(c.prompt) - len(mask)
        mask += [0] * gap
        mask += [1] * len(c.response)
        logprobs += [0.0] * gap
        logprobs += list(c.rec.response_logprobs)
        versions += [-1] * gap
        versions += c.rec.token_policy_versions
    return last.prompt_ids + last.response_ids, mask, logprobs, versions


def call_sampling(rec: TraceRecord) -> dict[str, float | int]:
    """The settings the engine sampled a call with: its request as sent to the engine, engine
    defaults (vLLM's) for keys it left out. The trainer rebuilds the same distribution from them."""
    body = rec.normalized_request or {}
    temperature, top_p, top_k = body.get("temperature"), body.get("top_p"), body.get("top_k")
    return {
        "temperature": 1.0 if temperature is None else float(temperature),
        "top_p": 1.0 if top_p is None else float(top_p),
        "top_k": -1 if top_k in (None, 0) else int(top_k),
    }


def spliced(call: Call) -> bool:
    """Token-faithful mode changed this prompt (the plain re-render would have drifted)."""
    r = call.rec.rendered_prompt_ids
    return r is not None and not np.array_equal(as_i32(r), call.prompt)
