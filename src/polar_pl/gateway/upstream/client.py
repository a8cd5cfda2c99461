"""HTTP client for the engine: one streaming chat call, parsed SSE chunk by chunk.

Two interchangeable implementations share one small contract (`UpstreamClient`): aiohttp (the
default) and httpx. bench/gateway.py measures both behind the gateway; aiohttp won there (lower
CPU per streamed request and shorter tails), so it is the default and httpx stays as the
comparison and a fallback.

Failures are raised as `UpstreamError` with a kind the core maps to a provider status:
"connect" (engine down), "timeout", "http" (engine answered 4xx/5xx) or "stream" (the engine
broke off or sent an error event mid-stream). `message` is what the harness is told and never
names the engine's address; `detail` (URL, the client library's exception) goes to the record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

if TYPE_CHECKING:
    import aiohttp

POLICY_HEADER = "x-policy-version"


class UpstreamError(Exception):
    def __init__(self, kind: str, message: str, status: int | None = None, detail: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.detail = detail

    @property
    def for_record(self) -> str:
        return f"{self.message} ({self.detail})" if self.detail else self.message


def _error_message(status: int, text: str) -> str:
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text[:2000] or f"engine answered HTTP {status}"
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


def _json_answer(text: str, url: str) -> Any:
    """A small call's JSON answer; an engine (or a proxy before it) answering anything else is a
    broken engine (502), not the caller's bad input."""
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise UpstreamError(
            "http", "engine answered with something that is not JSON", 502, f"{url}: {exc}"
        ) from exc


def parse_sse_line(line: bytes) -> dict[str, Any] | None | Literal[False]:
    """One SSE line -> chunk dict, None (not a data line) or False (the [DONE] sentinel)."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return False
    if not payload:
        return None
    chunk = orjson.loads(payload)
    if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
        err = chunk["error"]
        msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        status = err.get("code") if isinstance(err, dict) and isinstance(err.get("code"), int) else None
        raise UpstreamError("stream", msg, status)
    return chunk


class SSEParser:
    """Incremental SSE parser: raw bytes in (any split), complete events' chunk dicts out.

    Working on whole network reads (not line by line) keeps the per-chunk cost low, and lets the
    relay forward everything that arrived together in one write.

    elide: (key, value) JSON bytes: in the first event that holds `key` followed by `value`, the
    value is parsed as `null` instead (`elided` turns true). A token-in request's prompt comes back
    in the first event (`"prompt_token_ids":`), tens of thousands of ids the gateway sent itself:
    found byte for byte, it is the prompt that was sent, and is neither parsed nor converted again.
    """

    __slots__ = ("_buf", "_elide", "_keep", "done", "elided")

    def __init__(self, elide: tuple[bytes, bytes] | None = None):
        self._buf = b""
        self.done = False
        self._elide = b"".join(elide) if elide else None
        self._keep = len(elide[0]) if elide else 0
        self.elided = False

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        buf = self._buf + data if self._buf else data
        out = []
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            line = buf[start:end]
            start = end + 1
            if line.startswith(b"data:"):
                if self._elide is not None:
                    line = self._cut(line)
                chunk = parse_sse_line(line)
                if chunk is False:
                    self.done = True
                    break
                if chunk is not None:
                    out.append(chunk)
        self._buf = buf[start:]
        return out

    def _cut(self, line: bytes) -> bytes:
        assert self._elide is not None  # feed cuts only while there is one
        i = line.find(self._elide)
        if i < 0:
            return line
        self.elided, n, self._elide = True, len(self._elide), None
        return b"%snull%s" % (line[: i + self._keep], line[i + n :])


class ChatStream(Protocol):
    """An open engine stream. Iterate for chunk dicts; `close()` aborts the engine request.
    elided: the `elide` bytes given to `stream_chat` were found (and parsed as null)."""

    policy_version: int | None

    @property
    def elided(self) -> bool: ...

    def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The chunks as they arrive: one list per network read."""

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]: ...

    def close(self, abort: bool = False) -> None:
        """Called once when the call ends; abort=True drops the connection so the engine stops
        generating (vLLM aborts a request whose client went away)."""


class UpstreamClient(Protocol):
    async def stream_chat(
        self, url: str, body: bytes, elide: tuple[bytes, bytes] | None = None
    ) -> ChatStream:
        """POST a streaming chat request; raises UpstreamError before the first byte on failure.
        elide: see SSEParser."""

    async def request_json(self, method: str, url: str, body: Any = None, timeout: float = 10.0) -> Any:
        """A small JSON call (models, health, tokenize)."""

    async def close(self) -> None: ...


def _policy(headers) -> int | None:
    v = headers.get(POLICY_HEADER)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _json_as_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Fallback for an upstream that ignored stream=true: one synthesized chunk per choice."""
    if not isinstance(body, dict):
        raise UpstreamError("http", "engine answered with something that is not a completion", 502)
    chunks = []
    for ch in body.get("choices", []):
        msg = ch.get("message") or {}
        delta = {k: msg.get(k) for k in ("role", "content", "reasoning_content") if msg.get(k) is not None}
        if msg.get("tool_calls"):
            delta["tool_calls"] = [dict(tc, index=i) for i, tc in enumerate(msg["tool_calls"])]
        chunks.append(
            {
                "id": body.get("id"),
                "object": "chat.completion.chunk",
                "created": body.get("created"),
                "model": body.get("model"),
                "prompt_token_ids": body.get("prompt_token_ids"),
                "choices": [
                    {
                        "index": ch.get("index", 0),
                        "delta": delta,
                        "logprobs": ch.get("logprobs"),
                        "finish_reason": ch.get("finish_reason"),
                        "token_ids": ch.get("token_ids"),
                    }
                ],
            }
        )
    if body.get("usage"):
        chunks.append({"id": body.get("id"), "choices": [], "usage": body["usage"]})
    return chunks


# ---- aiohttp ------------------------------------------------------------------------------


class _StreamBase:
    _parser: SSEParser
    batches: Callable[[], AsyncIterator[list[dict[str, Any]]]]  # each stream class reads its own transport

    @property
    def elided(self) -> bool:
        return self._parser.elided

    async def __aiter__(self):
        async for batch in self.batches():
            for chunk in batch:
                yield chunk


class _AiohttpStream(_StreamBase):
    def __init__(self, resp, elide: tuple[bytes, bytes] | None = None):
        self._resp = resp
        self.policy_version = _policy(resp.headers)
        self._parser = SSEParser(elide)

    async def batches(self):
        import aiohttp

        resp = self._resp
        try:
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                yield _json_as_chunks(
                    _json_answer((await resp.read()).decode(errors="replace"), str(resp.url))
                )
                return
            parser = self._parser
            async for data in resp.content.iter_any():
                chunks = parser.feed(data)
                if chunks:
                    yield chunks
                if parser.done:
                    return
            raise UpstreamError("stream", "engine closed the stream before [DONE]")
        except TimeoutError as exc:  # before ClientConnectionError: aiohttp's timeouts are both
            raise UpstreamError("timeout", "engine stream timed out") from exc
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise UpstreamError("stream", "engine stream broke", detail=repr(exc)) from exc

    def close(self, abort: bool = False) -> None:
        if abort:
            self._resp.close()
        else:
            self._resp.release()


class AiohttpClient:
    def __init__(self, connect_timeout: float = 5.0, read_timeout: float = 600.0):
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._session: aiohttp.ClientSession | None = None

    def _get(self):
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                # idle connections dropped before the engine's server drops them (uvicorn, as vLLM
                # and the embedded engine run it, after 5 s): a POST on one it already closed fails
                connector=aiohttp.TCPConnector(
                    limit=0, ttl_dns_cache=None, enable_cleanup_closed=True, keepalive_timeout=4.0
                ),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self._connect_timeout, sock_read=self._read_timeout
                ),
                json_serialize=lambda o: orjson.dumps(o).decode(),
                auto_decompress=False,
            )
        return self._session

    async def stream_chat(
        self, url: str, body: bytes, elide: tuple[bytes, bytes] | None = None
    ) -> ChatStream:
        import aiohttp

        try:
            resp = await self._post(url, body)
        except TimeoutError as exc:
            raise UpstreamError("timeout", "engine timed out", detail=url) from exc
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, ConnectionError) as exc:
            raise UpstreamError("connect", "engine unreachable", detail=f"{url}: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError("connect", "engine request failed", detail=f"{url}: {exc!r}") from exc
        if resp.status >= 400:
            try:
                text = await resp.text()
            finally:
                resp.release()
            raise UpstreamError("http", _error_message(resp.status, text), resp.status)
        return _AiohttpStream(resp, elide)

    async def _post(self, url: str, body: bytes):
        """POST once more when a pooled connection turns out closed by the engine before the
        request went out (its keep-alive ran out as we took it): nothing reached the engine."""
        import aiohttp

        try:
            return await self._get().post(url, data=body, headers={"content-type": "application/json"})
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            return await self._get().post(url, data=body, headers={"content-type": "application/json"})

    async def request_json(self, method: str, url: str, body: Any = None, timeout: float = 10.0) -> Any:
        import aiohttp

        try:
            async with self._get().request(
                method,
                url,
                data=None if body is None else orjson.dumps(body),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise UpstreamError("http", _error_message(resp.status, text), resp.status)
                return _json_answer(text, url)
        except TimeoutError as exc:
            raise UpstreamError("timeout", "engine timed out", detail=url) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError("connect", "engine unreachable", detail=f"{url}: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# ---- httpx --------------------------------------------------------------------------------


class _HttpxStream(_StreamBase):
    def __init__(self, resp, elide: tuple[bytes, bytes] | None = None):
        self._resp = resp
        self.policy_version = _policy(resp.headers)
        self._parser = SSEParser(elide)

    async def batches(self):
        import httpx

        resp = self._resp
        try:
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                yield _json_as_chunks(
                    _json_answer((await resp.aread()).decode(errors="replace"), str(resp.url))
                )
                return
            parser = self._parser
            async for data in resp.aiter_raw():
                chunks = parser.feed(data)
                if chunks:
                    yield chunks
                if parser.done:
                    return
            raise UpstreamError("stream", "engine closed the stream before [DONE]")
        except httpx.TimeoutException as exc:
            raise UpstreamError("timeout", "engine stream timed out") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError("stream", "engine stream broke", detail=repr(exc)) from exc

    def close(self, abort: bool = False) -> None:
        import asyncio

        asyncio.get_running_loop().create_task(self._resp.aclose())


class HttpxClient:
    def __init__(self, connect_timeout: float = 5.0, read_timeout: float = 600.0):
        import httpx

        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
        )

    async def stream_chat(
        self, url: str, body: bytes, elide: tuple[bytes, bytes] | None = None
    ) -> ChatStream:
        import httpx

        req = self._client.build_request(
            "POST", url, content=body, headers={"content-type": "application/json"}
        )
        try:
            resp = await self._client.send(req, stream=True)
        except httpx.TimeoutException as exc:
            raise UpstreamError("timeout", "engine timed out", detail=url) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError("connect", "engine unreachable", detail=f"{url}: {exc!r}") from exc
        if resp.status_code >= 400:
            text = (await resp.aread()).decode(errors="replace")
            await resp.aclose()
            raise UpstreamError("http", _error_message(resp.status_code, text), resp.status_code)
        return _HttpxStream(resp, elide)

    async def request_json(self, method: str, url: str, body: Any = None, timeout: float = 10.0) -> Any:
        import httpx

        try:
            resp = await self._client.request(method, url, json=body, timeout=timeout)
        except httpx.TimeoutException as exc:
            raise UpstreamError("timeout", "engine timed out", detail=url) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError("connect", "engine unreachable", detail=f"{url}: {exc!r}") from exc
        if resp.status_code >= 400:
            raise UpstreamError("http", _error_message(resp.status_code, resp.text), resp.status_code)
        return _json_answer(resp.text, url)

    async def close(self) -> None:
        await self._client.aclose()


def make_client(kind: str, **kw) -> UpstreamClient:
    if kind == "aiohttp":
        return AiohttpClient(**kw)
    if kind == "httpx":
        return HttpxClient(**kw)
    raise ValueError(f"gateway upstream client={kind!r}: allowed 'aiohttp', 'httpx'")
