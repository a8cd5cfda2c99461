"""Real input-token counts for `/v1/messages/count_tokens`.

The count is what the engine would see: the normalized chat request rendered with the served
model's chat template (the same renderer the embedded engine uses, which mirrors vLLM) and
tokenized. The tokenizer is loaded once (at start in token-faithful mode, else on first use) from
the model directory the engine serves; with no directory the gateway asks the engine's
`/tokenize` route (vLLM serves one). A prompt past the engine's context is counted only until it
is: its count is then a lower bound (>= the context), which is all a harness deciding to compact
needs, and a 10 MB prompt costs one context's worth of tokenizing.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from polar_pl.gateway.upstream.client import UpstreamClient, UpstreamError


class TokenCounter:
    def __init__(self, tokenizer_dir: str | Path | None, client: UpstreamClient):
        self._dir = Path(tokenizer_dir) if tokenizer_dir else None
        self._client = client
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def local(self) -> bool:
        return self._dir is not None

    def tokenizer(self):
        """The served model's tokenizer (loaded once, thread-safe); needs tokenizer_dir."""
        if self._dir is None:
            raise ValueError("no tokenizer_dir: the gateway has no tokenizer")
        return self._load()

    def load(self) -> None:
        """Load the tokenizer now (at gateway start, off the event loop), if there is one."""
        if self._dir is not None:
            self._load()

    def _load(self):
        with self._lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(str(self._dir))
        return self._tokenizer

    def _count_local(self, chat: dict[str, Any], limit: int | None) -> int:
        from polar_pl.chat.render import render_chat
        from polar_pl.gateway.faithful.context import ContextTooLong, check_fits

        if limit is not None:
            try:
                check_fits(self._load(), chat, limit)
            except ContextTooLong as exc:  # past the context the exact count does not matter
                return exc.tokens
        _, ids = render_chat(self._load(), chat.get("messages") or [], chat.get("tools") or None)
        return len(ids)

    async def count(self, chat: dict[str, Any], engine_url: str, model: str, limit: int | None = None) -> int:
        """Token count of the prompt; raises RenderError/UpstreamError on failure. limit: the
        engine's context; a prompt past it is counted only until it is (a count >= limit)."""
        if self._dir is not None:
            return await asyncio.to_thread(self._count_local, chat, limit)
        body = {"model": model, "messages": chat.get("messages") or [], "add_generation_prompt": True}
        if chat.get("tools"):
            body["tools"] = chat["tools"]
        data = await self._client.request_json("POST", f"{engine_url}/tokenize", body, timeout=60.0)
        count = data.get("count") if isinstance(data, dict) else None
        if isinstance(count, bool) or not isinstance(count, int):
            raise UpstreamError("http", "the engine's /tokenize answer holds no token count", 502)
        return count
