"""Token-faithful mode and big prompts: the tokenizer is loaded at start, off the event loop; a
prompt longer than the engine's context is refused with context_length_exceeded before it is
tokenized whole; /health answers while a big prompt is handled.

The first call loaded the tokenizer on the event loop (6-12 s during which /health did not
answer), and a 10 MB prompt cost ~40 s of gateway CPU and 10 M token ids sent to an engine that
then refused them."""

from __future__ import annotations

import threading
import time

import anthropic
import httpx
import openai
import pytest

from polar_pl.gateway.faithful.context import ContextTooLong, check_fits
from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import serve_scripted


class CountingTokenizer:
    """The real tokenizer, counting the characters it was asked to encode."""

    def __init__(self, inner):
        self.inner, self.encoded = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, text, **kw):
        self.encoded += len(text)
        return self.inner.encode(text, **kw)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_a_prompt_far_past_the_context_is_refused_after_tokenizing_about_one_context(tokenizer):
    counting = CountingTokenizer(tokenizer)
    text = "the quick brown fox jumps over the lazy dog\n" * 100_000  # 4.4 MB
    with pytest.raises(ContextTooLong, match="context_length_exceeded") as exc:
        check_fits(counting, {"messages": [{"role": "user", "content": text}]}, limit=2000)
    assert exc.value.tokens >= 2000 and counting.encoded < 20_000  # not 4.4 M characters


def test_a_prompt_that_fits_passes_and_a_short_one_is_not_tokenized(tokenizer):
    counting = CountingTokenizer(tokenizer)
    check_fits(counting, {"messages": [{"role": "user", "content": "word " * 500}]}, limit=2000)
    check_fits(counting, {"messages": [{"role": "user", "content": "hi"}]}, limit=2000)
    assert counting.encoded > 0
    with pytest.raises(ContextTooLong):
        check_fits(counting, {"messages": [{"role": "user", "content": "word " * 5000}]}, limit=2000)


@pytest.fixture
def small_context_engine(tiny_model_dir, script):
    with serve_scripted(script, model_dir=tiny_model_dir, max_model_len=4096) as srv:
        yield srv


def test_past_the_context_is_refused_in_each_shape_and_health_answers_meanwhile(
    small_context_engine, tmp_path, tiny_model_dir
):
    with Gateway([small_context_engine.url], tmp_path / "t.db", tokenizer_dir=tiny_model_dir) as gw:
        assert gw.runtime.counter._tokenizer is not None  # loaded at start, before serving
        s = gw.create_session()
        big = "many words in a very long prompt " * 150_000  # 5 MB
        answered_during: list[float] = []
        done = threading.Event()

        def poll_health() -> None:
            while not done.is_set():
                r = httpx.get(f"{gw.url}/health", timeout=30)
                if not done.is_set() and r.status_code == 200:
                    answered_during.append(time.monotonic())
                time.sleep(0.02)

        poller = threading.Thread(target=poll_health, daemon=True)
        poller.start()
        with pytest.raises(anthropic.BadRequestError) as exc:
            anthropic.Anthropic(base_url=s.base_url, api_key="x", max_retries=0).messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": big}]
            )
        done.set()
        poller.join(30)
        assert "prompt is too long" in exc.value.message and "4096" in exc.value.message
        assert answered_during, "/health did not answer while the big prompt was handled"
        with pytest.raises(openai.BadRequestError) as oexc:
            openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "word " * 5000}]
            )
        assert oexc.value.code == "context_length_exceeded"
        recs = gw.records(s.session_id)
        assert [r.status for r in recs] == ["error", "error"] and "context length" in recs[0].error
        assert small_context_engine.backend.requests == []  # the engine never got them
