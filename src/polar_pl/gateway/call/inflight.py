"""`CallInFlight`: one model call on its way through the proxy, with everything its trace record
needs and what it holds of the engine until the proxy gives it back."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from polar_pl.gateway.call.capture import CallCapture
from polar_pl.gateway.call.toolguard import ToolCallGuard
from polar_pl.gateway.faithful.prompt import FaithfulPrompt
from polar_pl.gateway.providers import ProviderAdapter
from polar_pl.gateway.providers.base import StreamTranslator
from polar_pl.gateway.store.records import SessionInfo, TraceRecord
from polar_pl.gateway.upstream.client import ChatStream
from polar_pl.gateway.upstream.replicas import Replica


@dataclass(slots=True)
class CallInFlight:
    """One model call in flight: everything its trace record needs."""

    session: SessionInfo
    provider: str
    adapter: ProviderAdapter
    path: str
    raw: Any
    call_index: int
    timestamp: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.monotonic)
    norm: Any = None
    engine_body: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    call_kind: str = "main"
    replica: Replica | None = None
    faithful: FaithfulPrompt | None = None
    end_turn_at_cap: bool = False  # cap_policy end_turn and the gateway's cap bounds this call
    guard: ToolCallGuard | None = None  # set once the request's tools are known
    body: bytes = b""  # as the harness sent it: what a record that cannot be encoded keeps
    # what the call holds of the engine, given back by Proxy._release
    gated: bool = False
    counted: Replica | None = None
    stream: ChatStream | None = None
    # the response so far, for a record written by whoever ends the call
    cap: CallCapture | None = None
    sent: list[bytes] = field(default_factory=list)
    translator: StreamTranslator | None = None  # a streaming call's, once its relay started
    recorded: bool = False
    pending: bool = False  # an ok record committed before its delivery (FULL): mark it at the end

    def for_harness(self, finish_reason: str | None) -> str | None:
        """The finish reason the harness is told (cap_policy end_turn: a cut at the cap is a stop)."""
        if self.end_turn_at_cap and finish_reason == "length":
            return "stop"
        return finish_reason

    def chunk_for_harness(self, chunk: dict[str, Any]) -> dict[str, Any]:
        choices = chunk.get("choices") if self.end_turn_at_cap else None
        if not choices or not any(c.get("finish_reason") == "length" for c in choices):
            return chunk
        return {
            **chunk,
            "choices": [{**c, "finish_reason": self.for_harness(c.get("finish_reason"))} for c in choices],
        }

    def record(
        self, cap: CallCapture | None, raw_response: str, status: str = "ok", error: str | None = None
    ) -> TraceRecord:
        cap = cap or CallCapture()
        notes = [*self.notes, *(self.guard.notes if self.guard else ())]
        if self.end_turn_at_cap and cap.finish_reason == "length":
            notes = [*notes, "cap_policy end_turn: cut at the response cap, the harness was told end of turn"]
        if cap.response_ids and len(cap.logprobs) != len(cap.response_ids):
            notes = [*notes, f"engine sent {len(cap.logprobs)} logprobs for {len(cap.response_ids)} tokens"]
        s = self.session
        return TraceRecord(
            session_id=s.session_id,
            call_index=self.call_index,
            timestamp=self.timestamp,
            provider=self.provider,
            raw_request=self.raw,
            raw_response=raw_response,
            normalized_request=self.engine_body,
            prompt_ids=cap.prompt_ids or (self.faithful.prompt_ids if self.faithful else []),
            response_ids=cap.response_ids,
            response_logprobs=cap.logprobs,
            finish_reason=cap.finish_reason,
            policy_version=cap.policy_version,
            latency_s=time.monotonic() - self.t0,
            status=status,
            error=error,
            task_id=s.task_id,
            group_id=s.group_id,
            rollout_id=s.rollout_id,
            call_kind=self.call_kind,
            notes=tuple(notes),
            response_policy_versions=cap.token_versions if cap.version_varied else None,
            upstream=self.replica.url if self.replica else None,
            path=self.path,
            rendered_prompt_ids=self.faithful.rendered_if_different if self.faithful else None,
        )
