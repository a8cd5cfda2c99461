"""The core request path for one model call.

adapter.to_chat -> volatile-content removal -> side-call tagging -> engine request (always a
stream, with logprobs and token ids; in token-faithful mode a token-id prompt to /v1/completions whose
stream is translated back to chat chunks, faithful/) -> each engine chunk is captured and, for a streaming
harness, translated and forwarded at once -> one TraceRecord, committed to the store before the
harness receives the last bytes of its response. Failed calls are recorded with their error; a
harness that goes away mid-stream aborts the engine request and leaves an "aborted" record with
the partial response.

Every engine call passes the engine gate (call/gate.py) first: it counts calls in flight and holds new
ones while a weight update has paused the gateway. A `max_tokens_cap` bounds each call's response
length whatever the harness asks for (Claude Code asks for 32000). `cap_policy` says what the
harness is told when the cap (not its own limit) cut a response: `length` reports the truth
(max_tokens / length / MAX_TOKENS), which Claude Code and Codex turn into an error exit;
`end_turn` reports a normal end of turn, so the harness carries on with the answer it got. The
record keeps the truth either way (finish_reason "length", and a note).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response

from polar_pl.gateway.call.capture import CallCapture
from polar_pl.gateway.call.gate import EngineGate
from polar_pl.gateway.call.sampling import check_policy, settle_sampling
from polar_pl.gateway.call.sidecalls import SideCallRule, classify
from polar_pl.gateway.call.stats import GatewayStats
from polar_pl.gateway.call.volatile import strip_volatile
from polar_pl.gateway.faithful.completion import CompletionStream, completion_body
from polar_pl.gateway.faithful.history import TokenFaithful
from polar_pl.gateway.faithful.prompt import FaithfulPrompt
from polar_pl.gateway.http.errors import error_response, upstream_status
from polar_pl.gateway.providers import ProviderAdapter, RequestError
from polar_pl.gateway.store.records import SessionInfo, TraceRecord
from polar_pl.gateway.store.sessions import SessionRegistry
from polar_pl.gateway.store.traces import TraceStore
from polar_pl.gateway.upstream.client import ChatStream, UpstreamClient, UpstreamError
from polar_pl.gateway.upstream.replicas import Replica, ReplicaPool

# Added to every engine request: the capture needs token ids, logprobs and final usage.
CAPTURE_FIELDS = {
    "stream": True,
    "stream_options": {"include_usage": True},
    "logprobs": True,
    "top_logprobs": 0,
    "return_token_ids": True,
}
CAP_POLICIES = ("length", "end_turn")
# What an adapter raises when it trips over input it did not expect (not a RequestError).
ADAPTER_BUGS = (KeyError, TypeError, ValueError, AttributeError, IndexError)
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


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

    def for_harness(self, finish_reason: str | None) -> str | None:
        """The finish reason the harness is told (cap_policy end_turn: a cut at the cap is a stop)."""
        if self.end_turn_at_cap and finish_reason == "length":
            return "stop"
        return finish_reason

    def chunk_for_harness(self, chunk: dict[str, Any]) -> dict[str, Any]:
        choices = chunk.get("choices") if self.end_turn_at_cap else None
        if not choices or not any(c.get("finish_reason") == "length" for c in choices):
            return chunk
        return {**chunk, "choices": [{**c, "finish_reason": self.for_harness(c.get("finish_reason"))} for c in choices]}

    def record(
        self, cap: CallCapture | None, raw_response: str, status: str = "ok", error: str | None = None
    ) -> TraceRecord:
        cap = cap or CallCapture()
        notes = self.notes
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


class Proxy:
    def __init__(
        self,
        *,
        store: TraceStore,
        sessions: SessionRegistry,
        pool: ReplicaPool,
        client: UpstreamClient,
        side_rules: tuple[SideCallRule, ...],
        faithful: TokenFaithful | None = None,
        max_tokens_cap: int | None = None,
        sampling: str = "recorded",
        cap_policy: str = "length",
        gate: EngineGate | None = None,
    ):
        if max_tokens_cap is not None and (not isinstance(max_tokens_cap, int) or max_tokens_cap < 1):
            raise ValueError(f"max_tokens_cap: {max_tokens_cap!r}; allowed: a positive integer or None")
        if cap_policy not in CAP_POLICIES:
            raise ValueError(f"cap_policy: {cap_policy!r}; allowed: {', '.join(CAP_POLICIES)}")
        self.cap_policy = cap_policy
        self.store = store
        self.sessions = sessions
        self.pool = pool
        self.client = client
        self.side_rules = side_rules
        # The policy version of engines that do not report one (vLLM): set by whoever pushes the
        # weights, while the gateway is paused (Gateway.set_policy_version).
        self.version_hint = 0

        self.faithful = faithful
        self.max_tokens_cap = max_tokens_cap
        self.sampling = check_policy(sampling)
        self.gate = gate or EngineGate()
        self.stats = GatewayStats()

    def _version(self, stream: ChatStream) -> int:
        return stream.policy_version if stream.policy_version is not None else self.version_hint

    def _append(self, rec: TraceRecord) -> Future:
        self.stats.observe(rec)
        if self.faithful is not None:
            self.faithful.remember(rec)
        return self.store.append(rec)

    def forget(self, session_id: str) -> None:
        """Drop a deleted session's in-memory history."""
        if self.faithful is not None:
            self.faithful.forget(session_id)

    def _engine_done(self, call: CallInFlight) -> None:
        call.replica.inflight -= 1
        self.gate.leave()

    # ---- the engine step ------------------------------------------------------------------
    async def open_engine_stream(self, call: CallInFlight) -> ChatStream:
        """Send the call to its replica (chat, or token-in when `call.faithful` holds a prompt);
        on a refused connection fail over to another one."""
        for _ in range(len(self.pool.replicas)):
            rep = call.replica = self.pool.pick(call.session.session_id)
            rep.inflight += 1  # counted from the start: prefill is load too
            try:
                call.engine_body["model"] = await self.pool.model_for(rep)
                if call.faithful is None:
                    return await self.client.stream_chat(
                        rep.endpoint("/v1/chat/completions"), orjson.dumps(call.engine_body)
                    )
                body = completion_body(call.engine_body, call.faithful.prompt_ids)
                stream = await self.client.stream_chat(rep.endpoint("/v1/completions"), orjson.dumps(body))
                return CompletionStream(stream, call.engine_body, self.faithful.reasoning_parser)
            except UpstreamError as exc:
                rep.inflight -= 1
                if exc.kind != "connect" or len(self.pool.replicas) == 1:
                    raise
                self.pool.mark_dead(rep)
                if not any(r.healthy for r in self.pool.replicas):
                    raise
        raise UpstreamError("connect", "no engine replica is reachable")

    # ---- entry point ------------------------------------------------------------------------
    async def model_call(
        self,
        *,
        session: SessionInfo,
        provider: str,
        adapter: ProviderAdapter,
        path: str,
        query: dict[str, str],
        body: bytes,
    ) -> Response:
        call = CallInFlight(
            session=session,
            provider=provider,
            adapter=adapter,
            path=path,
            raw=None,
            call_index=self.sessions.next_call_index(session.session_id),
        )
        try:
            call.raw = orjson.loads(body) if body else None
            if not isinstance(call.raw, dict):
                raise RequestError("request body must be a JSON object")
            call.norm = adapter.to_chat(call.raw, path=path, query=query)
        except (RequestError, orjson.JSONDecodeError) as exc:
            if not isinstance(call.raw, dict):  # keep the bytes the harness sent, whatever they were
                call.raw = {"_unparsed_body": body.decode("utf-8", "replace")}
            return await self._fail(call, 400, f"invalid request: {exc}")
        except ADAPTER_BUGS as exc:  # the adapter tripped on input it did not expect
            return await self._fail(call, 400, f"malformed request: {type(exc).__name__}: {exc}")
        chat = dict(call.norm.chat)
        call.notes = [*call.norm.notes, *strip_volatile(chat)]
        side = classify(self.side_rules, provider=provider, model=call.norm.model, chat=chat)
        if side:
            call.call_kind = "side"
            call.notes.append(f"side call: {side}")
        capped = self._cap_max_tokens(chat, call.notes)
        call.end_turn_at_cap = capped and self.cap_policy == "end_turn"
        settle_sampling(chat, self.sampling, call.notes)
        if self.faithful is None:
            call.engine_body = {**chat, **CAPTURE_FIELDS}
        else:  # the record keeps the chat body; the engine gets its token-in equivalent
            call.engine_body = chat
            try:
                call.faithful = await self.faithful.prompt(session.session_id, chat)
            except ValueError as exc:  # the template cannot render these messages (as the engine)
                return await self._fail(call, 400, f"invalid request: {exc}")
            if call.faithful.anchor is not None and call.faithful.rendered_if_different is not None:
                call.notes.append(f"token-faithful: sampled tokens of call {call.faithful.anchor} spliced in")
        if not await self.gate.enter():
            status = adapter.retryable_status(503)
            return await self._fail(call, status, "engine paused for a weight update; retry shortly")
        try:
            stream = await self.open_engine_stream(call)
        except UpstreamError as exc:
            self.gate.leave()
            return await self._fail(call, upstream_status(adapter, exc), exc.message)
        call.replica.served += 1
        if call.norm.stream:
            media = call.norm.extra.get("media_type", "text/event-stream")
            return RelayResponse(self._relay(call, stream), media, SSE_HEADERS)
        return await self._collect(call, stream)

    def _cap_max_tokens(self, chat: dict[str, Any], notes: list[str]) -> bool:
        """max_tokens = min(requested or cap, cap); a clipped request is noted in the record.
        True when the cap, not the harness's own max_tokens, bounds the response."""
        cap = self.max_tokens_cap
        if cap is None:
            return False
        requested = chat.pop("max_completion_tokens", None) or chat.get("max_tokens")
        chat["max_tokens"] = min(requested or cap, cap)
        if requested is not None and requested > cap:
            notes.append(f"max_tokens capped: requested {requested}, sent {cap}")
        return requested is None or requested > cap

    async def _fail(
        self, call: CallInFlight, status: int, message: str, cap: CallCapture | None = None
    ) -> Response:
        resp = error_response(call.provider, status, message)
        await _durable(self._append(call.record(cap, resp.body.decode(), "error", message)))
        return resp

    async def _collect(self, call: CallInFlight, stream: ChatStream) -> Response:
        """Non-streaming harness: consume the engine stream, then answer in one piece."""
        cap = CallCapture(self._version(stream))
        try:
            async for chunk in stream:
                cap.add(chunk)
        except UpstreamError as exc:
            status = upstream_status(call.adapter, exc)
            resp = error_response(call.provider, status, exc.message)
            await _durable(self._append(call.record(cap, resp.body.decode(), "error", exc.message)))
            return resp
        finally:
            self._engine_done(call)
            stream.close(abort=cap.finish_reason is None)
        completion = cap.completion()
        completion["choices"] = [
            {**c, "finish_reason": call.for_harness(c.get("finish_reason"))} for c in completion.get("choices", [])
        ]
        try:
            body = orjson.dumps(call.adapter.from_chat(completion, call.norm))
        except ADAPTER_BUGS as exc:  # the sampled tokens are still recorded
            return await self._fail(call, 500, f"gateway error: {type(exc).__name__}: {exc}", cap)
        await _durable(self._append(call.record(cap, body.decode())))
        return Response(body, media_type="application/json")

    async def _relay(self, call: CallInFlight, stream: ChatStream) -> AsyncIterator[bytes]:
        """Streaming harness: forward the translated engine chunks as they arrive (what arrived in
        one network read goes out in one write)."""
        cap = CallCapture(self._version(stream))
        translator = call.adapter.stream(call.norm)
        sent: list[bytes] = []
        recorded = False
        try:
            out = translator.start()
            if out:
                sent.append(out)
                yield out
            async for batch in stream.batches():
                parts = []
                for chunk in batch:
                    cap.add(chunk)
                    if piece := translator.feed(call.chunk_for_harness(chunk)):
                        parts.append(piece)
                if parts:
                    out = parts[0] if len(parts) == 1 else b"".join(parts)
                    sent.append(out)
                    yield out
            tail = translator.finish(call.for_harness(cap.finish_reason), cap.usage_or_counted())
            sent.append(tail)
            fut = self._append(call.record(cap, b"".join(sent).decode()))
            recorded = True
            await _durable(fut)  # durable before the harness sees the end
            yield tail
        except UpstreamError as exc:
            tail = translator.error(upstream_status(call.adapter, exc), exc.message)
            sent.append(tail)
            fut = self._append(call.record(cap, b"".join(sent).decode(), "error", exc.message))
            recorded = True
            await _durable(fut)
            yield tail
        except Exception as exc:  # a translator bug must still leave a record
            if not recorded:
                recorded = True
                self._append(
                    call.record(
                        cap, b"".join(sent).decode(), "error", f"gateway error: {type(exc).__name__}: {exc}"
                    )
                )
            raise
        finally:
            self._engine_done(call)
            stream.close(abort=not recorded or cap.finish_reason is None)
            if not recorded:  # the harness went away: the engine request is already aborted
                self._append(
                    call.record(cap, b"".join(sent).decode(), "aborted", "client disconnected mid-stream")
                )


async def _durable(fut) -> None:
    """Wait for a store commit; inline commits are already done (no loop round trip)."""
    if fut.done():
        fut.result()
    else:
        await asyncio.wrap_future(fut)


class RelayResponse(Response):
    """Streams an async byte iterator with plain ASGI sends (no per-response task group).

    A watcher waits for the client's `http.disconnect`; when it comes first, the streaming task is
    cancelled, which runs the relay's cleanup at once (engine request aborted, partial response
    recorded as "aborted"). The generator is always closed, whatever ends the response.
    """

    def __init__(self, body: AsyncIterator[bytes], media_type: str, headers: dict[str, str]):
        self.body_iterator = body
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope, receive, send) -> None:
        task = asyncio.current_task()
        disconnected = False

        async def watch() -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for part in self.body_iterator:
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not disconnected:
                raise
            task.uncancel()  # the client is gone: a normal end for this response
        finally:
            watcher.cancel()
            await self.body_iterator.aclose()
