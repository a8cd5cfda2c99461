"""The core request path for one model call.

adapter.to_chat -> volatile-content removal -> side-call tagging -> engine request (always a
stream, with logprobs and token ids; in token-faithful mode a token-id prompt to /v1/completions whose
stream is translated back to chat chunks, faithful/) -> each engine chunk is captured and, for a streaming
harness, translated and forwarded at once -> one TraceRecord, committed to the store before the
harness receives the last bytes of its response. Failed calls are recorded with their error; a
harness that goes away mid-stream aborts the engine request and leaves an "aborted" record with
the partial response, and so does a non-streamed call whose harness leaves before its answer
(call/respond.py watches the client while the engine generates). When the gateway stops, `stop`
marks it stopping and the calls in flight are cancelled (http/harness_routes.py): each aborts its
engine request and is recorded "aborted" with the reason ("gateway shut down"). Every call that
got past auth leaves exactly one record, whatever fails.

What a call holds of the engine (a gate slot, its replica's in-flight count, the open engine
stream) is given back by one idempotent `_release`, reached from every way a call can end: a
failed step, a bug, a cancellation, the end of the response or a response that never started.
A store that cannot commit (disk full) is answered like a busy engine: a retryable 503 / 529, or
an error event closing the stream; `gateway/store_errors` counts it. When the store commits on a
writer thread (FULL), an ok record is "pending" until its response was handed to the server, so a
gateway killed in between leaves it marked undelivered, not ok.

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
import contextlib
import logging
from collections.abc import AsyncGenerator
from concurrent.futures import Future
from typing import Any, cast

import orjson
from starlette.responses import Response

from polar_pl.gateway.call.capture import CallCapture
from polar_pl.gateway.call.gate import EngineGate
from polar_pl.gateway.call.inflight import CallInFlight
from polar_pl.gateway.call.respond import CollectResponse, DeliveredResponse, LastPart, RelayResponse
from polar_pl.gateway.call.sampling import check_policy, settle_sampling
from polar_pl.gateway.call.sidecalls import SideCallRule, classify
from polar_pl.gateway.call.stats import GatewayStats
from polar_pl.gateway.call.toolguard import ToolCallGuard
from polar_pl.gateway.call.volatile import strip_volatile
from polar_pl.gateway.faithful.completion import CompletionStream, completion_bytes
from polar_pl.gateway.faithful.history import TokenFaithful
from polar_pl.gateway.http.errors import error_response, retryable_response, upstream_status
from polar_pl.gateway.providers import ProviderAdapter, RequestError, normalize
from polar_pl.gateway.store.records import SessionInfo, TraceRecord
from polar_pl.gateway.store.sessions import SessionRegistry
from polar_pl.gateway.store.traces import StoreUnavailable, TraceStore
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
STORE_FAILED = "the gateway's trace store cannot record this call; retry shortly"
STOPPING = "the gateway is shutting down; retry shortly"
log = logging.getLogger(__name__)


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
        pinned_temperature: float = 1.0,
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
        if not isinstance(pinned_temperature, int | float) or not 0 < pinned_temperature <= 2:
            raise ValueError(f"pinned_temperature: {pinned_temperature!r}; allowed: a number in (0, 2]")
        self.pinned_temperature = float(pinned_temperature)
        self.gate = gate or EngineGate()
        self.stats = GatewayStats()
        # why the gateway is stopping, once it is: the reason its aborted calls are recorded with
        self.stopping: str | None = None

    def _version(self, stream: ChatStream) -> int:
        return stream.policy_version if stream.policy_version is not None else self.version_hint

    def _append(self, call: CallInFlight, rec: TraceRecord) -> Future:
        """Hand the call's one record to the store (raises StoreUnavailable when it cannot take it)."""
        call.recorded = True
        first = call.cap.first_token_at if call.cap is not None else None
        self.stats.observe(rec, None if first is None else first - call.t0)
        if self.faithful is not None:
            self.faithful.remember(rec)
        call.pending = rec.status == "ok" and not self.store.inline
        return self.store.append(rec, raw_body=call.body, pending=call.pending)

    async def _commit(self, call: CallInFlight, rec: TraceRecord) -> bool:
        """Append the record and wait until it is durable; False when the store failed."""
        try:
            await _durable(self._append(call, rec))
        except StoreUnavailable as exc:
            call.pending = False
            log.warning("trace store: %s (session %s call %d)", exc, rec.session_id, rec.call_index)
            return False
        return True

    def forget(self, session_id: str) -> None:
        """Drop a deleted session's in-memory history."""
        if self.faithful is not None:
            self.faithful.forget(session_id)

    # ---- what a call holds of the engine -----------------------------------------------------
    def _uncount(self, call: CallInFlight) -> None:
        rep, call.counted = call.counted, None
        if rep is not None:
            rep.inflight -= 1

    def _release(self, call: CallInFlight, abort: bool = True) -> None:
        """Give back the engine stream, the replica's in-flight count and the gate slot; a no-op
        for whatever was already given back, so every way out of a call can call it."""
        stream, call.stream = call.stream, None
        gated, call.gated = call.gated, False
        try:
            if stream is not None:
                stream.close(abort=abort)
        finally:
            self._uncount(call)
            if gated:
                self.gate.leave()

    def _ended(self, call: CallInFlight, delivered: bool) -> None:
        """The harness's response is over (`delivered`: the server took all of it)."""
        self._release(call)
        try:
            if not call.recorded:  # left before its answer (or a stream that never started)
                reason = self.stopping or "client disconnected before the response"
                self._append(call, call.record(call.cap, b"".join(call.sent).decode(), "aborted", reason))
            elif call.pending:
                self.store.mark_delivered(call.session.session_id, call.call_index, delivered)
        except StoreUnavailable as exc:
            log.warning("trace store: %s", exc)

    # ---- the engine step ------------------------------------------------------------------
    async def open_engine_stream(self, call: CallInFlight) -> ChatStream:
        """Send the call to its replica (chat, or token-in when `call.faithful` holds a prompt);
        on a refused connection fail over to another one. The replica's in-flight count is the
        call's (`call.counted`) from the start, prefill is load too; the caller releases it."""
        for _ in range(len(self.pool.replicas)):
            rep = call.replica = self.pool.pick(call.session.session_id)
            rep.inflight += 1
            call.counted = rep
            try:
                call.stream = await self._send(call, rep)
                return call.stream
            except UpstreamError as exc:
                self._uncount(call)
                if exc.kind != "connect" or len(self.pool.replicas) == 1:
                    raise
                self.pool.mark_dead(rep)
                if not any(r.healthy for r in self.pool.replicas):
                    raise
        raise UpstreamError("connect", "no engine replica is reachable")

    async def _send(self, call: CallInFlight, rep: Replica) -> ChatStream:
        try:
            return await self._send_as(call, rep, await self.pool.model_for(rep))
        except UpstreamError as exc:
            if not self.pool.forget_gone_model(rep, exc):
                raise
        # the engine dropped the adapter it was asked for (it pushed a newer one): its name now
        return await self._send_as(call, rep, await self.pool.model_for(rep))

    async def _send_as(self, call: CallInFlight, rep: Replica, model: str) -> ChatStream:
        call.engine_body["model"] = model
        if call.faithful is None:
            return await self.client.stream_chat(
                rep.endpoint("/v1/chat/completions"), orjson.dumps(call.engine_body)
            )
        assert self.faithful is not None  # call.faithful is only built by it (_prepare)
        body, ids = completion_bytes(call.engine_body, call.faithful.prompt_ids)
        stream = await self.client.stream_chat(
            rep.endpoint("/v1/completions"), body, elide=(b'"prompt_token_ids":', ids)
        )
        return CompletionStream(stream, call.engine_body, self.faithful.reasoning_parser)

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
        parsed: Any = None,
    ) -> Response:
        """One model call, answered in the provider's shape and recorded exactly once.
        parsed: the body already parsed (and depth-checked) at the door, if it was."""
        call = CallInFlight(
            session=session,
            provider=provider,
            adapter=adapter,
            path=path,
            raw=parsed,
            call_index=self.sessions.next_call_index(session.session_id),
            body=body,
        )
        try:
            return await self._call(call, query)
        except Exception as exc:
            return await self._bug(call, exc)
        except BaseException:  # cancelled (the gateway is stopping): give back, keep a record
            self._release(call)
            if not call.recorded:
                with contextlib.suppress(StoreUnavailable):
                    reason = self.stopping or "gateway shut down"
                    self._append(call, call.record(call.cap, "", "aborted", reason))
            raise

    async def _bug(self, call: CallInFlight, exc: Exception) -> Response:
        """A gateway bug: logged, answered in the provider's shape, still recorded."""
        log.exception("gateway error in a %s call of %s", call.provider, call.session.session_id)
        self._release(call)
        if call.recorded:
            raise exc
        return await self._fail(call, 500, f"internal gateway error: {type(exc).__name__}")

    def stopped_answer(self, call: CallInFlight) -> Response | None:
        """What a non-streaming client is told when the gateway stops (None: not stopping)."""
        return None if self.stopping is None else retryable_response(call.provider, STOPPING)

    def stopped_tail(self, call: CallInFlight) -> bytes | None:
        """The error event that ends a stream when the gateway stops (None: not stopping)."""
        if self.stopping is None:
            return None
        translator = call.translator or call.adapter.stream(call.norm)
        return translator.error(call.adapter.retryable_status(503), STOPPING)

    async def refuse(
        self, *, session: SessionInfo, provider: str, path: str, status: int, message: str, body: bytes = b""
    ) -> Response:
        """A call refused before it was parsed (body too large, JSON too deep): answered in the
        provider's shape and recorded with the bytes that were read."""
        raw = {"_unparsed_body": body.decode("utf-8", "replace")} if body else {"_unread_body": message}
        call = CallInFlight(
            session=session,
            provider=provider,
            adapter=cast(ProviderAdapter, None),  # refused before parsing: _fail never uses it
            path=path,
            raw=raw,
            call_index=self.sessions.next_call_index(session.session_id),
        )
        return await self._fail(call, status, message)

    async def _call(self, call: CallInFlight, query: dict[str, str]) -> Response:
        adapter = call.adapter
        try:
            if call.raw is None:
                call.raw = orjson.loads(call.body) if call.body else None
            if not isinstance(call.raw, dict):
                raise RequestError("request body must be a JSON object")
            call.norm = normalize(adapter, call.raw, path=call.path, query=query)
        except (RequestError, orjson.JSONDecodeError) as exc:
            if not isinstance(call.raw, dict):  # keep the bytes the harness sent, whatever they were
                call.raw = {"_unparsed_body": call.body.decode("utf-8", "replace")}
            return await self._fail(call, 400, f"invalid request: {exc}")
        except ADAPTER_BUGS as exc:  # the adapter tripped on input it did not expect
            return await self._fail(call, 400, f"malformed request: {type(exc).__name__}: {exc}")
        if (refused := await self._prepare(call)) is not None:
            return refused
        if not await self.gate.enter():
            status = adapter.retryable_status(503)
            return await self._fail(call, status, "engine paused for a weight update; retry shortly")
        call.gated = True
        try:
            stream = await self.open_engine_stream(call)
        except UpstreamError as exc:
            self._release(call)
            return await self._fail(call, upstream_status(adapter, exc), exc.message, detail=exc.detail)
        assert call.replica is not None  # set by open_engine_stream
        call.replica.served += 1
        if call.norm.stream:
            media = call.norm.extra.get("media_type", "text/event-stream")
            on_end, stopped = lambda ok: self._ended(call, ok), lambda: self.stopped_tail(call)
            return RelayResponse(self._relay(call, stream), media, SSE_HEADERS, on_end, stopped)
        return CollectResponse(
            lambda: self._collect_safely(call, stream),
            lambda: self._ended(call, False),
            lambda: self.stopped_answer(call),
        )

    async def _prepare(self, call: CallInFlight) -> Response | None:
        """The engine body: volatile content out, side calls tagged, max_tokens capped, sampling
        settled, the token-faithful prompt built. A refusal (as a response) or None."""
        chat = dict(call.norm.chat)
        call.notes = [*call.norm.notes, *strip_volatile(chat)]
        side = classify(self.side_rules, provider=call.provider, model=call.norm.model, chat=chat)
        if side:
            call.call_kind = "side"
            call.notes.append(f"side call: {side}")
        call.guard = ToolCallGuard(chat.get("tools"))
        capped = self._cap_max_tokens(chat, call.notes)
        call.end_turn_at_cap = capped and self.cap_policy == "end_turn"
        settle_sampling(chat, self.sampling, call.notes, self.pinned_temperature)
        if self.faithful is None:
            call.engine_body = {**chat, **CAPTURE_FIELDS}
            return None
        call.engine_body = chat  # the record keeps the chat body; the engine gets its token-in equivalent
        try:
            limit = await self.pool.context_limit()
            call.faithful = await self.faithful.prompt(
                call.session.session_id, chat, call_kind=call.call_kind, limit=limit, body_size=len(call.body)
            )
        except ValueError as exc:  # the template cannot render these messages (as the engine)
            return await self._fail(call, 400, f"invalid request: {exc}")
        fp = call.faithful
        # an incremental prompt has no re-render to compare with: its splice is noted anyway
        if fp.anchor is not None and (fp.rendered_if_different is not None or fp.rendered_ids is None):
            call.notes.append(f"token-faithful: sampled tokens of call {fp.anchor} spliced in")
        return None

    def _cap_max_tokens(self, chat: dict[str, Any], notes: list[str]) -> bool:
        """max_tokens = min(requested or cap, cap); a clipped request is noted in the record.
        True when the cap, not the harness's own max_tokens, bounds the response. The requested
        value is a positive integer or absent: `normalize` checked it (providers/numbers.py)."""
        cap = self.max_tokens_cap
        if cap is None:
            return False
        requested = chat.pop("max_completion_tokens", None) or chat.get("max_tokens")
        chat["max_tokens"] = min(requested or cap, cap)
        if requested is not None and requested > cap:
            notes.append(f"max_tokens capped: requested {requested}, sent {cap}")
        return requested is None or requested > cap

    async def _fail(
        self,
        call: CallInFlight,
        status: int,
        message: str,
        cap: CallCapture | None = None,
        detail: str | None = None,
    ) -> Response:
        """The error answer, recorded first (a store that cannot take it does not change the
        answer). detail: for the record only (the engine's address, say), never for the harness."""
        resp = error_response(call.provider, status, message)
        error = f"{message} ({detail})" if detail else message
        await self._commit(call, call.record(cap, bytes(resp.body).decode(), "error", error))
        return resp

    def _store_failed(self, call: CallInFlight) -> tuple[int, str]:
        """What a harness is told when its call cannot be recorded: retry, like a busy engine."""
        return call.adapter.retryable_status(503), STORE_FAILED

    async def _collect_safely(self, call: CallInFlight, stream: ChatStream) -> Response:
        try:
            return await self._collect(call, stream)
        except Exception as exc:
            return await self._bug(call, exc)

    async def _collect(self, call: CallInFlight, stream: ChatStream) -> Response:
        """Non-streaming harness: consume the engine stream, then answer in one piece (cancelled
        when the harness leaves first: the engine request is aborted on the way out)."""
        cap = call.cap = CallCapture(self._version(stream))
        try:
            async for chunk in stream:
                cap.add(chunk)
        except UpstreamError as exc:
            self._release(call)
            return await self._fail(call, upstream_status(call.adapter, exc), exc.message, cap, exc.detail)
        finally:
            self._release(call, abort=cap.finish_reason is None)
        assert call.guard is not None  # set by _prepare
        completion = cap.completion()
        completion["choices"] = [
            {
                **c,
                "message": call.guard.filter_message(c.get("message") or {}),
                "finish_reason": call.guard.finish_reason(call.for_harness(c.get("finish_reason"))),
            }
            for c in completion.get("choices", [])
        ]
        try:
            body = orjson.dumps(call.adapter.from_chat(completion, call.norm))
        except (*ADAPTER_BUGS, orjson.JSONEncodeError) as exc:  # the sampled tokens are still recorded
            return await self._fail(call, 500, f"gateway error: {type(exc).__name__}: {exc}", cap)
        if not await self._commit(call, call.record(cap, body.decode())):
            return error_response(call.provider, *self._store_failed(call))
        if call.pending:
            return DeliveredResponse(body, lambda ok: self._ended(call, ok))
        return Response(body, media_type="application/json")

    async def _relay(self, call: CallInFlight, stream: ChatStream) -> AsyncGenerator[bytes, None]:
        """Streaming harness: forward the translated engine chunks as they arrive (what arrived in
        one network read goes out in one write); the end goes out once the record is durable."""
        cap = call.cap = CallCapture(self._version(stream))
        translator = call.translator = call.adapter.stream(call.norm)
        assert call.guard is not None  # set by _prepare
        sent = call.sent
        try:
            if out := translator.start():
                sent.append(out)
                yield out
            async for batch in stream.batches():
                parts = []
                for chunk in batch:
                    cap.add(chunk)
                    for out_chunk in call.guard.filter(call.chunk_for_harness(chunk)):
                        if piece := translator.feed(out_chunk):
                            parts.append(piece)
                if parts:
                    out = parts[0] if len(parts) == 1 else b"".join(parts)
                    sent.append(out)
                    yield out
            self._release(call, abort=cap.finish_reason is None)
            reason = call.guard.finish_reason(call.for_harness(cap.finish_reason))
            tail = translator.finish(reason, cap.usage_or_counted())
            if not await self._commit(call, call.record(cap, b"".join([*sent, tail]).decode())):
                tail = translator.error(*self._store_failed(call))
            sent.append(tail)
            yield LastPart(tail)
        except UpstreamError as exc:
            self._release(call)
            tail = translator.error(upstream_status(call.adapter, exc), exc.message)
            sent.append(tail)
            await self._commit(call, call.record(cap, b"".join(sent).decode(), "error", exc.for_record))
            yield LastPart(tail)
        except Exception as exc:  # a translator bug: still a record, and an error event, not a cut
            log.exception("gateway error relaying a %s stream", call.provider)
            if not call.recorded:
                message = f"gateway error: {type(exc).__name__}: {exc}"
                with contextlib.suppress(StoreUnavailable):
                    self._append(call, call.record(cap, b"".join(sent).decode(), "error", message))
            try:
                tail = translator.error(500, f"internal gateway error: {type(exc).__name__}")
            except Exception:
                raise exc from None
            yield tail
        finally:
            self._release(call)  # an early end (the harness went away): the engine request is aborted
            if not call.recorded:
                with contextlib.suppress(StoreUnavailable):
                    reason = self.stopping or "client disconnected mid-stream"
                    self._append(call, call.record(cap, b"".join(sent).decode(), "aborted", reason))


async def _durable(fut: Future) -> None:
    """Wait for a store commit; inline commits are already done (no loop round trip)."""
    if fut.done():
        fut.result()
    else:
        await asyncio.wrap_future(fut)
