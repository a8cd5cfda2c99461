"""Literal ChatML-like token ids and a record factory for trajectory tests.

Ids: 1 <|im_start|>, 2 <|im_end|> (EOS), 3 "\\n", 10 system, 11 user, 12 assistant, 13 tool
response tag; 100+ text, 200+ sampled text.
"""

from __future__ import annotations

from typing import Any

from polar_pl.gateway.store.records import TraceRecord

S, E, NL, SYS, USER, ASSIST, TOOL = 1, 2, 3, 10, 11, 12, 13


def system(*text: int) -> list[int]:
    return [S, SYS, NL, *text, E, NL]


def user(*text: int) -> list[int]:
    return [S, USER, NL, *text, E, NL]


def tool_result(*text: int) -> list[int]:
    return [S, USER, NL, TOOL, *text, TOOL, E, NL]


GEN = [S, ASSIST, NL]  # generation prompt


def rec(
    idx: int,
    prompt: list[int],
    response: list[int],
    *,
    session: str = "s1",
    kind: str = "main",
    finish: str | None = "stop",
    status: str = "ok",
    error: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    version: int = 0,
    versions: list[int] | None = None,
    logprobs: list[float] | None = None,
    rendered: list[int] | None = None,
) -> TraceRecord:
    lps = logprobs if logprobs is not None else [-(idx + 1) - k / 100 for k in range(len(response))]
    return TraceRecord(
        session_id=session,
        call_index=idx,
        timestamp=float(idx),
        provider="openai_chat",
        raw_request={},
        raw_response="",
        normalized_request={"messages": messages} if messages is not None else {},
        prompt_ids=list(prompt),
        response_ids=list(response),
        response_logprobs=lps,
        finish_reason=finish,
        policy_version=version,
        latency_s=0.0,
        status=status,
        error=error,
        task_id="t1",
        group_id="g1",
        rollout_id="r1",
        call_kind=kind,
        response_policy_versions=versions,
        rendered_prompt_ids=rendered,
    )
