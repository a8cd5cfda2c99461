"""The rollout service's HTTP boundary: request and response models (they make the OpenAPI schema)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pydantic import BaseModel, Field

from polar_pl.rollout.pools import AttemptInfo, RolloutResult
from polar_pl.rollout.service import Group
from polar_pl.trajectory.rows import TrajectoryRow


class ErrorBody(BaseModel):
    message: str
    type: str


class ErrorResponse(BaseModel):
    """Every 4xx/5xx answer: `{"error": {"message": ..., "type": ...}}`."""

    error: ErrorBody


class TasksRequest(BaseModel):
    """SWE-bench-style task rows (`instance_id`, `problem_statement`, and `repo`, `base_commit`,
    `FAIL_TO_PASS`, ... for patch-scored tasks, or `answer_check` for answer-scored ones)."""

    tasks: list[dict[str, Any]] = Field(min_length=1, max_length=10_000)


class TasksResponse(BaseModel):
    seqs: list[int] = Field(description="the group seq of each submitted task (one group of G attempts each)")


class Row(BaseModel):
    """One trajectory row: `loss_mask` is 1 exactly on tokens the policy sampled;
    `behavior_logprobs` are the engine's (0 where masked); `policy_version` per token (-1 masked)."""

    input_ids: list[int]
    loss_mask: list[int]
    behavior_logprobs: list[float]
    policy_version: list[int]
    session_id: str
    rollout_id: str
    group_id: str
    reward: float
    status: str
    harness: str | None = None
    call_indices: list[int] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict, description="call_kind (task | side), ...")


class Result(BaseModel):
    """One attempt. status: ok | timeout | failed | harness_error | infra_failure (masked: no rows)."""

    rollout_id: str
    status: str
    reward: float
    error: str | None = None
    failed_stage: str | None = None
    rows: list[Row]
    info: dict[str, Any] = Field(
        default_factory=dict, description="the attempt's AttemptInfo, its scalar fields that are set"
    )
    timings: dict[str, float] = Field(default_factory=dict, description="seconds spent in each stage")


class GroupOut(BaseModel):
    group_id: str
    seq: int
    task_id: str
    complete: bool = Field(description="false when the group deadline cut some attempts (see `missing`)")
    missing: list[str]
    results: list[Result]


class GroupsResponse(BaseModel):
    groups: list[GroupOut]


class ConsumedRequest(BaseModel):
    seqs: list[int] = Field(min_length=1)


class WeightsRequest(BaseModel):
    path: str = Field(
        description="a directory of *.safetensors with HF parameter names, readable by the service"
    )


class VersionRequest(BaseModel):
    version: int = Field(ge=0)


class VersionResponse(BaseModel):
    policy_version: int


_ROW_KEYS = tuple(Row.model_fields)


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, str | int | float | bool | None)}


def group_json(g: Group) -> dict[str, Any]:
    """A released group as `GroupOut` JSON (rows with their tokens, masks, logprobs, rewards)."""
    return {
        "group_id": g.group_id,
        "seq": g.seq,
        "task_id": str(getattr(g.task, "instance_id", g.task)),
        "complete": g.complete,
        "missing": list(g.missing),
        "results": [
            {
                "rollout_id": r.rollout_id,
                "status": r.status,
                "reward": r.reward,
                "error": r.error,
                "failed_stage": r.failed_stage,
                "rows": [_row_json(row) for row in r.rows],
                "info": _plain(r.info.as_dict()),
                "timings": r.timings,
            }
            for r in g.results
        ],
    }


def _row_json(row: TrajectoryRow) -> dict[str, Any]:
    out = {k: v for k, v in asdict(row).items() if k in _ROW_KEYS}
    out["meta"] = _plain(row.meta)
    return out


def _row(row: Row) -> TrajectoryRow:
    return TrajectoryRow(**{**row.model_dump(), "call_indices": tuple(row.call_indices)})


def group_from_json(g: GroupOut) -> Group:
    """The inverse of `group_json`: what a `rollout=remote` trainer gets from GET /v1/groups (the
    task is its id only; the service keeps the task itself)."""
    results = tuple(
        RolloutResult(
            rollout_id=r.rollout_id,
            group_id=g.group_id,
            task_id=g.task_id,
            status=r.status,
            reward=r.reward,
            error=r.error,
            failed_stage=r.failed_stage,
            timings=dict(r.timings),
            info=AttemptInfo.from_dict(r.info),
            rows=tuple(_row(row) for row in r.rows),
        )
        for r in g.results
    )
    return Group(group_id=g.group_id, seq=g.seq, task=g.task_id, results=results, missing=tuple(g.missing))
