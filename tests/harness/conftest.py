"""Harness test fixtures: the real engine server with a ScriptedBackend behind the real gateway
(module scope; each test sets the script), and per-backend sandboxes that can see the harness
prefix. The Docker engine fixtures come from tests/sandbox/conftest.py (re-exported here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixture_paths import HARNESS_PREFIX

from polar_pl.gateway.handle import Gateway
from polar_pl.testing.sandbox import (  # noqa: F401  (a real dockerd; the leftover check)
    OWNER,
    docker_engine,
    docker_image,
    no_sandbox_leftovers,
)
from polar_pl.testing.scripted import Reply, serve_scripted


class Script:
    """The engine's answer to each chat request: `reply(chat)`, set by the test."""

    def __init__(self) -> None:
        self.reply: Callable[[dict[str, Any]], Reply | str] = lambda chat: Reply("ok")
        self.chats: list[dict[str, Any]] = []

    def __call__(self, chat: dict[str, Any]) -> Reply | str:
        self.chats.append(chat)
        return self.reply(chat)


@pytest.fixture(scope="module")
def script() -> Script:
    return Script()


@pytest.fixture(scope="module")
def gateway(tiny_model_dir, script, tmp_path_factory) -> Iterator[Gateway]:
    with serve_scripted(script, model_dir=tiny_model_dir) as engine:
        store = tmp_path_factory.mktemp("gateway") / "traces.db"
        # The chat path (token_faithful off): the script reads the chat body (tools, tool results),
        # which token-in requests do not carry.
        with Gateway(
            [engine.url],
            store,
            tokenizer_dir=tiny_model_dir,
            store_synchronous="NORMAL",
            token_faithful=False,
        ) as gw:
            yield gw


def _make(kind: str, request):
    from polar_pl.sandbox.local import LocalSandbox

    prefix = str(HARNESS_PREFIX)
    if kind == "bwrap":
        return LocalSandbox(isolation="bwrap", owner=OWNER, harness_prefix=prefix)
    engine = request.getfixturevalue("docker_engine")
    image = request.getfixturevalue("docker_image")
    from polar_pl.sandbox.docker import DockerSandbox

    return DockerSandbox(image=image, docker_host=engine.url, owner=OWNER, harness_prefix=prefix)


@pytest.fixture(scope="session")
def harness_prefix() -> Path:
    return HARNESS_PREFIX


@pytest.fixture
def backend_sandbox(request):
    """A started sandbox of the backend named by the test's `backend` parameter."""
    sb = _make(request.getfixturevalue("backend"), request)
    sb.start()
    yield sb
    sb.stop()
