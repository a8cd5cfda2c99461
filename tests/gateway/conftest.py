"""Gateway test fixtures: the real engine server with a ScriptedBackend (real tokenization, real
token ids and logprobs, scripted replies) and a gateway in front of it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from polar_pl.engine.errors import EngineError
from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import Reply, ScriptedServer, serve_scripted


class Script:
    """Replies queued by a test, then `default(chat)`; `fail` makes every call an engine error."""

    def __init__(self):
        self.queue: deque[Reply | str] = deque()
        self.default: Callable[[dict[str, Any]], Reply | str] = lambda chat: Reply("Hello from the engine.")
        self.fail: int | None = None
        self.chats: list[dict[str, Any]] = []

    def __call__(self, chat: dict[str, Any]) -> Reply | str:
        self.chats.append(chat)
        if self.fail:
            raise EngineError("scripted engine failure", self.fail)
        return self.queue.popleft() if self.queue else self.default(chat)


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def engine(tiny_model_dir, script) -> Iterator[ScriptedServer]:
    with serve_scripted(script, model_dir=tiny_model_dir) as srv:
        yield srv


@pytest.fixture
def gateway(engine, tmp_path, tiny_model_dir) -> Iterator[Gateway]:
    """The chat path (token_faithful off): these tests' scripts read the chat body, and a
    token-in request reaches the scripted engine without one."""
    gw = Gateway(
        [engine.url],
        tmp_path / "traces.db",
        tokenizer_dir=tiny_model_dir,
        store_synchronous="NORMAL",
        token_faithful=False,
    ).start()
    yield gw
    gw.stop()


@pytest.fixture
def faithful_gateway(engine, tmp_path, tiny_model_dir) -> Iterator[Gateway]:
    """The default with a tokenizer: token-faithful prompts, token-in engine calls."""
    gw = Gateway([engine.url], tmp_path / "faithful.db", tokenizer_dir=tiny_model_dir).start()
    assert gw.stats()["gateway/token_faithful"] == 1.0
    yield gw
    gw.stop()


@pytest.fixture
def admin(gateway) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=gateway.url, headers={"authorization": f"Bearer {gateway.admin_token}"}, timeout=30
    ) as c:
        yield c
