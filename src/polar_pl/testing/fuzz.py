"""Malformed input against the gateway: the fuzz kit behind bench/fuzz_gateway.py and
tests/gateway/test_fuzz.py.

Each request is a valid request of one API (Anthropic Messages and count_tokens, OpenAI Chat,
OpenAI Responses, Google generateContent; stream or not) with one to three mutations: JSON nested
130 to 1,100 levels anywhere, values of the wrong type, keys dropped or added, broken or truncated
JSON bytes, non-object bodies, huge strings and arrays, control characters and odd numbers, a
numeric sampling field of the API (max_tokens, max_output_tokens, temperature, ...) set to a
string, list, object, bool or out-of-range number, unknown roles and content parts, and a few
bodies over the 32 MiB limit. The gateway runs in-process in front of the scripted engine (the
real engine server on the tiny model), with or without a `max_tokens_cap` (the cap does arithmetic
on the requested length: a string there was a 500), so the counters can be read after the pass.
What `run_pass` measures:

- 5xx answers (the target: 0), error answers not in the provider's error shape (0), and
  tracebacks logged by the gateway or its server (0);
- streams that end without their grammar's last event or an error event (0);
- calls that reached the gateway with a valid token and left no record (0);
- in-flight counters after the pass (gate and replicas: 0) and how long `pause("drain")` takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import aiohttp

from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import Reply, serve_scripted

USER = [{"role": "user", "content": "hi"}]
TOOL_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "anthropic": (
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 16,
            "system": "be brief",
            "messages": USER,
            "tools": [{"name": "read", "description": "read a file", "input_schema": TOOL_SCHEMA}],
            "metadata": {"user_id": "u"},
        },
    ),
    "anthropic_count": ("/v1/messages/count_tokens", {"model": "m", "messages": USER}),
    "openai_chat": (
        "/v1/chat/completions",
        {
            "model": "m",
            "max_tokens": 16,
            "messages": [{"role": "system", "content": "brief"}, *USER],
            "tools": [{"type": "function", "function": {"name": "read", "parameters": TOOL_SCHEMA}}],
        },
    ),
    "openai_responses": (
        "/v1/responses",
        {
            "model": "m",
            "instructions": "brief",
            "max_output_tokens": 16,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "tools": [{"type": "function", "name": "read", "parameters": TOOL_SCHEMA}],
        },
    ),
    "google": (
        "/v1beta/models/m:generateContent",
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "systemInstruction": {"parts": [{"text": "brief"}]},
            "generationConfig": {"maxOutputTokens": 16},
            "tools": [{"functionDeclarations": [{"name": "read", "parameters": TOOL_SCHEMA}]}],
        },
    ),
}
ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5e308,
    -0.0,
    "",
    "x",
    "\u0000\u202e\ud7ff",
    [],
    {},
    [None],
    {"": {}},
    "<|im_end|>\n<|im_start|>system\n",
    "\n" * 50,
]
# The numeric sampling fields of each API (gateway/providers/numbers.py checks them), and what the
# "sampling" mutation puts there.
SAMPLING: dict[str, tuple[tuple[str, ...], ...]] = {
    "anthropic": (("max_tokens",), ("temperature",), ("top_p",), ("top_k",), ("thinking", "budget_tokens")),
    "openai_chat": (
        ("max_tokens",),
        ("max_completion_tokens",),
        ("temperature",),
        ("top_p",),
        ("n",),
        ("seed",),
        ("presence_penalty",),
        ("frequency_penalty",),
        ("top_logprobs",),
        ("top_k",),
    ),
    "openai_responses": (("max_output_tokens",), ("temperature",), ("top_p",), ("top_logprobs",)),
    "google": (
        ("generationConfig", "maxOutputTokens"),
        ("generationConfig", "temperature"),
        ("generationConfig", "topP"),
        ("generationConfig", "topK"),
        ("generationConfig", "seed"),
        ("generationConfig", "candidateCount"),
        ("generation_config", "max_output_tokens"),
        ("generationConfig", "thinkingConfig", "thinkingBudget"),
    ),
}
ODD_NUMBERS = [
    "16",
    [16],
    {"n": 16},
    True,
    False,
    "",
    "NaN",
    -5,
    0,
    3.5,
    -0.0,
    10**30,
    2**64 - 1,
    1e300,
    None,
]
DEEP = "\u0000deep\u0000"  # a string placeholder: deep JSON is spliced in as text after encoding


def _nodes(value: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _nodes(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _nodes(v, (*path, i))
    return out


def _set(root: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = root
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return root


def _set_field(body: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set a field, making the objects above it where the body has none."""
    parent = body
    for key in path[:-1]:
        if not isinstance(parent.get(key), dict):
            parent[key] = {}
        parent = parent[key]
    parent[path[-1]] = value


def _mutate(rng: random.Random, api: str, body: Any) -> tuple[Any, list[int]]:
    """One structural mutation; returns the body and the depths of any deep JSON to splice."""
    op = rng.choice(("deep", "retype", "drop", "add", "huge", "roles", "numbers", "sampling"))
    path = rng.choice(_nodes(body))
    deep: list[int] = []
    if op == "sampling":
        if isinstance(body, dict) and SAMPLING.get(api):
            _set_field(body, rng.choice(SAMPLING[api]), copy.deepcopy(rng.choice(ODD_NUMBERS)))
    elif op == "deep":
        deep.append(rng.choice((130, 200, 254, 300, 600, 1000, 1100)))
        body = _set(body, path, DEEP)
    elif op == "retype":
        body = _set(body, path, copy.deepcopy(rng.choice(ODD_VALUES)))
    elif op == "drop" and path:
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    elif op == "add":
        dicts = [p for p in _nodes(body) if isinstance(_get(body, p), dict)]
        if dicts:
            key = rng.choice(("stream", "n", "tool_choice", "thinking", "logprobs", "zz", "stop", "seed"))
            _get(body, rng.choice(dicts))[key] = copy.deepcopy(rng.choice(ODD_VALUES))
    elif op == "huge":
        body = _set(
            body, path, rng.choice(("w " * 500_000, [1] * 200_000, [{"role": "user", "content": "x"}] * 3000))
        )
    elif op == "roles":
        body = _set(
            body,
            path,
            rng.choice(
                (
                    {"role": "wizard", "content": "x"},
                    {"type": "image", "source": {"type": "base64", "data": "!!"}},
                    {"type": "tool_result", "tool_use_id": "nope", "content": [{"type": "weird"}]},
                    {"role": "assistant", "tool_calls": [{"function": {"arguments": "{not json"}}]},
                    {"functionResponse": {"name": 1, "response": "x"}},
                    {"type": "input_image", "image_url": 7},
                )
            ),
        )
    else:
        body = _set(body, path, rng.choice((-5, 0, 10**30, 3.7, "16", float("1e300"))))
    return body, deep


def _get(root: Any, path: tuple) -> Any:
    for key in path:
        root = root[key]
    return root


def _encode(body: Any, deep: list[int]) -> bytes:
    text = json.dumps(body)
    for levels in deep:
        text = text.replace(json.dumps(DEEP), '{"a":' * levels + "1" + "}" * levels, 1)
    return text.encode()


def _broken_bytes(rng: random.Random, raw: bytes) -> bytes:
    return rng.choice(
        (
            raw[: rng.randrange(1, max(2, len(raw)))],
            b"",
            b"null",
            b"[]",
            b'"text"',
            b"42",
            b"{",
            b"\xff\xfe{}",
            b"\xef\xbb\xbf" + raw,
            raw.replace(b"16", b"NaN", 1),
            raw + b"garbage",
            b'{"a":"\\ud800"}',
            raw.replace(b'"hi"', b'"\xc3\x28"', 1),
            b"{" * 2000 + b"}" * 2000,
        )
    )


def make_request(rng: random.Random, i: int) -> tuple[str, str, bytes, bool]:
    """(api, path, body bytes, stream) for request number i."""
    api = rng.choice(list(BASES))
    path, base = BASES[api]
    body = json.loads(json.dumps(base))
    stream = api != "anthropic_count" and rng.random() < 0.5
    if stream and api == "google":
        path = path.replace(":generateContent", ":streamGenerateContent") + "?alt=sse"
    elif stream:
        body["stream"] = True
    if i % 500 == 499:  # over the 32 MiB limit
        return (
            api,
            path,
            b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * (33 << 20) + b'"}]}',
            stream,
        )
    deep: list[int] = []
    for _ in range(rng.randint(1, 3)):
        body, more = _mutate(rng, api, body)
        deep += more
        if len(json.dumps(body)) > 100_000:  # a huge value: walking it again would be slow
            break
    raw = _encode(body, deep)
    if rng.random() < 0.15:
        raw = _broken_bytes(rng, raw)
    return api, path, raw, stream


def provider_shaped(api: str, data: Any) -> bool:
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return False
    if api.startswith("anthropic"):
        return data.get("type") == "error" and isinstance(err.get("type"), str)
    if api == "google":
        return isinstance(err.get("code"), int) and isinstance(err.get("status"), str)
    return isinstance(err.get("type"), str)


def stream_ended(api: str, text: str) -> bool:
    """Did the stream end with its grammar's last event, or an error event in that grammar?"""
    blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    if not blocks:
        return False
    last = blocks[-1]
    data = last.split("data:", 1)[-1].strip()
    if api == "anthropic":
        return "event: message_stop" in last or "event: error" in last
    if api == "openai_chat":
        return data == "[DONE]" or '"error"' in data
    if api == "openai_responses":
        return any(f"event: response.{k}" in last for k in ("completed", "incomplete", "failed"))
    return '"finishReason"' in data or '"error"' in data


def _examples(tally: Counter) -> list[str]:
    """The few examples a tally keeps, as a list under "examples" beside its counts."""
    return tally.setdefault("examples", [])  # type: ignore[arg-type, return-value]  # a Counter holds ints


async def send(
    session: aiohttp.ClientSession, base: str, api: str, path: str, raw: bytes, stream: bool, tally
) -> None:
    try:
        async with session.post(f"{base}{path}", data=raw, headers={"content-type": "application/json"}) as r:
            text = (await r.read()).decode("utf-8", "replace")
            status = r.status
            stream = r.headers.get("content-type", "").startswith("text/event-stream")  # what was answered
    except aiohttp.ClientError as exc:
        tally["transport errors"] += 1
        _examples(tally).append(f"{api} {path}: {exc!r}")
        return
    tally[f"{status // 100}xx"] += 1
    if status >= 500:
        _examples(tally).append(f"{api} {path} {status}: {text[:200]}")
    if status != 200:
        try:
            shaped = provider_shaped(api, json.loads(text))
        except ValueError:
            shaped = False
        tally["not provider-shaped"] += not shaped
    elif stream and not stream_ended(api, text):
        tally["streams cut"] += 1
        _examples(tally).append(f"{api} {path} cut: ...{text[-200:]}")


async def fuzz(gw: Gateway, n: int, seed: int, concurrency: int) -> Counter:
    rng = random.Random(seed)
    tally: Counter = Counter()
    sessions = [gw.create_session() for _ in range(8)]
    queue = [make_request(rng, i) for i in range(n)]
    tally["model calls"] = sum(1 for api, *_ in queue if api != "anthropic_count")
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def worker(w: int) -> None:
            while queue:
                api, path, raw, stream = queue.pop()
                await send(http, sessions[w % len(sessions)].base_url, api, path, raw, stream, tally)

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    records = [r for s in sessions for r in gw.records(s.session_id)]
    tally["records"] = len(records)
    failed = [r.error for r in records if r.error and r.error.startswith("engine")]
    _examples(tally).extend(f"record: {e[:300]}" for e in failed[:5])
    return tally


class _TracebackCounter(logging.Handler):
    """Counts log records that carry a traceback (the gateway's `log.exception`, uvicorn's
    "Exception in ASGI application"), keeping the first lines of a few."""

    def __init__(self, tally: Counter):
        super().__init__(logging.ERROR)
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.tally["tracebacks"] += 1
            _examples(self.tally).append(f"traceback: {record.getMessage()[:200]}")


@contextlib.contextmanager
def counting_tracebacks(tally: Counter) -> Iterator[None]:
    """Count tracebacks logged anywhere while the block runs (uvicorn's loggers do not propagate)."""
    handler = _TracebackCounter(tally)
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def run_pass(
    mode: str, n: int, seed: int, concurrency: int, model_dir: Path, out: Path, cap: int | None = None
) -> dict[str, Any]:
    """One pass of `n` requests; mode "chat" or "faithful" (token-faithful prompts); cap: the
    gateway's max_tokens_cap. Returns the counters (module docstring) and a few examples."""
    tally: Counter = Counter()
    with serve_scripted(lambda chat: Reply("fine."), model_dir=model_dir) as engine:
        faithful = mode == "faithful"
        with (
            counting_tracebacks(tally),
            Gateway(
                [engine.url],
                out / f"{mode}-{cap}.db",
                tokenizer_dir=model_dir,
                token_faithful=faithful,
                max_tokens_cap=cap,
            ) as gw,
        ):
            t0 = time.monotonic()
            tally.update(asyncio.run(fuzz(gw, n, seed, concurrency)))
            wall = time.monotonic() - t0
            stats = gw.stats()
            t1 = time.monotonic()
            gw.pause("drain", timeout=10)
            drain_s = time.monotonic() - t1
            gw.resume()
    return {
        "mode": mode,
        "cap": cap,
        "requests": n,
        "wall_s": round(wall, 1),
        **{k: v for k, v in tally.items() if k != "examples"},
        "5xx": tally["5xx"],
        "tracebacks": tally["tracebacks"],
        "unrecorded calls": tally["model calls"] - tally["records"],
        "in_flight after": stats["gateway/in_flight"],
        "replica inflight after": stats["gateway/inflight"],
        "gate waiting after": stats["gateway/gate_waiting"],
        "drain_s": round(drain_s, 3),
        "examples": cast(list[str], tally.get("examples", []))[:10],
    }


def failures(result: dict[str, Any]) -> int:
    """What must be 0 after a pass: 5xx, unshaped errors, cut streams, tracebacks, unrecorded
    calls, counters left in flight."""
    keys: tuple[str, ...] = ("5xx", "not provider-shaped", "streams cut", "tracebacks", "unrecorded calls")
    keys += ("in_flight after", "replica inflight after", "gate waiting after")
    return int(sum(result.get(k, 0) for k in keys))
