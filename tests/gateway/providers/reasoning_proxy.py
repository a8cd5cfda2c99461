"""A reasoning parser in front of the scripted engine, for the thinking round-trip tests.

The embedded engine, like vLLM started without `--reasoning-parser`, streams the model's
`<think>...</think>` block as content. vLLM with `--reasoning-parser qwen3` streams the text
between the tags as `delta.reasoning` instead; this proxy does the same to the engine's chunks
(token ids and logprobs untouched), so the adapters' thinking paths run against real tokens.
It is a test double for the parser only; everything else is forwarded as is.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_KEEP_HEADERS = ("content-type", "x-policy-version")


class ThinkSplitter:
    """Per-stream state: before, inside, just closed, or after the `<think>` block."""

    def __init__(self) -> None:
        self.state = "before"

    def split(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if not text:
                continue
            if self.state == "before" and text.strip() == "<think>":
                self.state, delta["content"] = "inside", ""
            elif self.state == "inside":
                if text.strip() == "</think>":
                    self.state, delta["content"] = "closed", ""
                else:
                    delta["reasoning"], delta["content"] = text, ""
            elif self.state == "closed" and not text.strip():
                delta["content"] = ""  # vLLM drops the whitespace between </think> and the answer
            else:
                self.state = "after"


def reasoning_proxy(upstream: str) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=120)

    async def forward(request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        sent = client.build_request(
            request.method,
            request.url.path,
            params=request.query_params,
            headers=headers,
            content=await request.body(),
        )
        answer = await client.send(sent, stream=True)
        kept = {k: v for k, v in answer.headers.items() if k.lower() in _KEEP_HEADERS}
        if "text/event-stream" not in answer.headers.get("content-type", ""):
            return Response(await answer.aread(), status_code=answer.status_code, headers=kept)
        splitter = ThinkSplitter()

        async def events() -> AsyncIterator[bytes]:
            async for line in answer.aiter_lines():
                if line.startswith("data: {"):
                    chunk = orjson.loads(line[6:])
                    splitter.split(chunk)
                    line = "data: " + orjson.dumps(chunk).decode()
                yield (line + "\n").encode()
            await answer.aclose()

        return StreamingResponse(events(), status_code=answer.status_code, headers=kept)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])], lifespan=lifespan)
