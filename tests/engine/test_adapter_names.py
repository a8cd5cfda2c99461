"""An adapter name means the same in both engines (issue 58): the embedded engine holds one
merged adapter, so a request naming an older one (`tiny-lora-v1` after v2 was pushed) is refused
with vLLM's 404 `model_not_found`, never served by the newer weights under the old name. The check
is made where the request is admitted to the batch, on the thread that applies pushes, so a push
that lands between the route's check and the admission cannot slip the newer weights in."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from adapter_kit import push_adapter

from polar_pl.engine.backend import GenerationRequest, SamplingParams
from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.errors import EngineError

PROMPT = list(range(400, 420))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with EmbeddedEngine(tiny_model_dir, served_model_name="tiny", max_batch_size=4, max_model_len=256) as eng:
        yield eng


def complete(engine: EmbeddedEngine, model: str, route: str = "completions") -> httpx.Response:
    if route == "completions":
        body = {"model": model, "prompt": PROMPT, "max_tokens": 3, "temperature": 0}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    return httpx.post(f"{engine.base_url}/{route}", json=body, timeout=60)


def test_a_request_naming_an_adapter_the_engine_no_longer_holds_is_refused(engine) -> None:
    """Failure guarded: after v2 was pushed, a request for `tiny-lora-v1` was answered by v2's
    weights under the name `tiny-lora-v1` and tagged version 2 (the LoRA train test's trace store
    then held ('tiny-lora-v1', 2))."""
    v1 = push_adapter(engine, seed=1)
    v2 = push_adapter(engine, seed=2)
    for route in ("completions", "chat/completions"):
        for stream in (False, True):
            body = {"model": f"tiny-lora-v{v1}", "max_tokens": 3, "stream": stream,
                    "messages": [{"role": "user", "content": "hi"}], "prompt": PROMPT}  # fmt: skip
            r = httpx.post(f"{engine.base_url}/{route}", json=body, timeout=60)
            assert r.status_code == 404, r.text
            err = r.json()["error"]
            assert err["code"] == "model_not_found" and err["param"] == "model"
            assert f"tiny-lora-v{v1}" in err["message"] and f"tiny-lora-v{v2}" in err["message"]
        ok = complete(engine, f"tiny-lora-v{v2}", route)
        assert ok.status_code == 200 and ok.json()["model"] == f"tiny-lora-v{v2}"
        assert ok.json()["policy_version"] == v2
    cards = httpx.get(f"{engine.base_url}/models", timeout=10).json()["data"]
    assert [c["id"] for c in cards] == ["tiny", f"tiny-lora-v{v2}"]


def test_the_adapter_is_checked_when_the_request_is_admitted(engine) -> None:
    """Failure guarded: the name was checked on the event loop, and a push landing before the
    scheduler admitted the request served it by the next adapter."""
    push_adapter(engine, seed=3)
    stale = engine.model
    push_adapter(engine, seed=4)
    request = GenerationRequest("r-stale", tuple(PROMPT), SamplingParams(max_tokens=2), adapter=stale)

    async def first_batch():
        return await anext(aiter(engine.backend.generate(request)))

    with pytest.raises(EngineError) as refused:
        asyncio.run(first_batch())
    assert refused.value.status == 404 and refused.value.code == "model_not_found"
    current = GenerationRequest("r-now", tuple(PROMPT), SamplingParams(max_tokens=2), adapter=engine.model)

    async def all_batches():
        return [d async for batch in engine.backend.generate(current) for d in batch]

    deltas = asyncio.run(all_batches())
    assert {d.policy_version for d in deltas} == {engine.policy_version()}
