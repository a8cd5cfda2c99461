"""The trace record: one per model call, written by the gateway, read by trajectory builders.

The record is the contract between the gateway and everything downstream. It is lossless: raw
request and raw response are kept untruncated, and the token ids and logprobs are exactly what the
engine reported for the call.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One model call as seen at the gateway.

    prompt_ids: token ids the engine was given (after token-faithful splicing when enabled).
    rendered_prompt_ids: the plain re-render of the messages, kept only where it differs from
        prompt_ids (token-faithful mode); None otherwise. Drift = rendered != spliced.
    response_ids / response_logprobs: sampled tokens and their logprobs, aligned, same length.
    call_kind: "main" for the task's main line, "side" for title / memory / router calls.
    status: "ok", "error" (error holds the message), "aborted" (client went away mid-stream;
        the partial response is kept) or "undelivered" (committed, but the response never reached
        the harness: the gateway died or the harness left before the end, store/traces.py).
    notes: what the gateway changed or dropped while normalizing (e.g. "dropped tool web_search",
        "stripped billing header").
    """

    session_id: str
    call_index: int
    timestamp: float
    provider: str
    raw_request: dict[str, Any]
    raw_response: str
    normalized_request: dict[str, Any]
    prompt_ids: list[int] | np.ndarray
    response_ids: list[int]
    response_logprobs: list[float]
    finish_reason: str | None
    policy_version: int
    latency_s: float
    status: str = "ok"
    error: str | None = None
    task_id: str | None = None
    group_id: str | None = None
    rollout_id: str | None = None
    call_kind: str = "main"
    notes: tuple[str, ...] = ()
    rendered_prompt_ids: list[int] | None = None
    response_policy_versions: list[int] | None = None
    upstream: str | None = None
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TraceRecord:
        return cls.from_owned_dict(dict(d))

    @classmethod
    def from_owned_dict(cls, d: dict[str, Any]) -> TraceRecord:
        """`from_dict` on a dict the caller gives up (the store's decoder: no copy, per record)."""
        d["notes"] = tuple(d.get("notes") or ())
        if not d.keys() <= _FIELDS:  # a record written by a newer version: its extra fields dropped
            d = {k: v for k, v in d.items() if k in _FIELDS}
        return cls(**d)

    def with_raw_request(self, raw_body: bytes, reason: str) -> TraceRecord:
        """This record with the request kept as the bytes the harness sent (for a record whose
        parsed request cannot be encoded); the normalized request is dropped, the tokens kept."""
        return replace(
            self,
            raw_request={"_unparsed_body": raw_body.decode("utf-8", "replace")},
            normalized_request={},
            notes=(
                *self.notes,
                f"request kept as raw bytes: the parsed request cannot be encoded ({reason})",
            ),
        )

    @property
    def token_policy_versions(self) -> list[int]:
        """Policy version of each sampled token (a weight update may land mid-generation)."""
        if self.response_policy_versions is not None:
            return list(self.response_policy_versions)
        return [self.policy_version] * len(self.response_ids)


_FIELDS = frozenset(TraceRecord.__dataclass_fields__)


def hash_token(token: str) -> str:
    """What the store keeps of a session token. Tokens are 192 random bits: one SHA-256 is enough."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A registered session (one harness run on one task). The token itself is handed out once,
    when the session is created; the gateway and its store keep only `token_hash`."""

    session_id: str
    token_hash: str
    task_id: str | None = None
    group_id: str | None = None
    rollout_id: str | None = None
    harness: str | None = None
    created: float = 0.0
    deleted: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionInfo:
        d = dict(d)
        if "token" in d:  # a store written before tokens were hashed
            d["token_hash"] = hash_token(d.pop("token"))
        return cls(**d)
