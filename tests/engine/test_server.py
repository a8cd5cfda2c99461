"""The embedded engine (transformers backend) over real HTTP, with the official OpenAI SDK."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

MSGS = [{"role": "user", "content": "Say something."}]


def client(engine, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.base_url, api_key="x", max_retries=0, **kw)


def test_health_models_and_version_header(engine):
    r = httpx.get(f"{engine.url}/health")
    assert r.status_code == 200 and r.headers["x-policy-version"] == str(engine.policy_version())
    models = client(engine).models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_tokenize_detokenize_routes(engine):
    """/tokenize renders a chat exactly as /v1/chat/completions does; /detokenize inverts it;
    bad input gets OpenAI error JSON (the gateway counts Anthropic tokens through /tokenize)."""
    messages = [{"role": "user", "content": "Count these tokens."}]
    chat = httpx.post(
        f"{engine.base_url}/chat/completions",
        json={"model": "tiny", "messages": messages, "max_tokens": 1, "return_token_ids": True},
    ).json()
    tok = httpx.post(f"{engine.url}/tokenize", json={"model": "tiny", "messages": messages}).json()
    assert tok["tokens"] == chat["prompt_token_ids"] and tok["count"] == len(tok["tokens"])
    text = httpx.post(f"{engine.url}/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>user\nCount these tokens.")
    bad = httpx.post(f"{engine.url}/tokenize", json={"model": "tiny"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    assert httpx.post(f"{engine.url}/detokenize", json={"tokens": [10**9]}).status_code == 400


def test_chat_logprobs_and_token_ids(engine):
    r = client(engine).chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = r.choices[0]
    token_ids = choice.model_extra["token_ids"]
    assert len(token_ids) == 6 == r.usage.completion_tokens
    assert choice.finish_reason == "length"
    content = choice.logprobs.content
    assert [len(c.top_logprobs) for c in content] == [3] * 6
    for c in content:
        # greedy: the sampled token is the most likely one and is listed first
        assert c.top_logprobs[0].token == c.token and c.top_logprobs[0].logprob == c.logprob
        assert c.logprob <= 0 and c.bytes == list(c.token.encode())
    tok_text = "".join(c.token for c in content)
    assert tok_text == choice.message.content
    prompt_ids = r.model_extra["prompt_token_ids"]
    assert len(prompt_ids) == r.usage.prompt_tokens
    assert r.model_extra["policy_version"] == engine.policy_version()


def test_stream_matches_non_stream(engine):
    c = client(engine)
    kwargs = {
        "model": "tiny",
        "messages": MSGS,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 0,
        "extra_body": {"return_token_ids": True, "ignore_eos": True},
    }
    full = c.chat.completions.create(**kwargs)
    chunks = list(c.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model_extra["prompt_token_ids"] == full.model_extra["prompt_token_ids"]
    body = [ch for ch in chunks if ch.choices][1:]
    ids = [t for ch in body for t in ch.choices[0].model_extra["token_ids"]]
    assert ids == full.choices[0].model_extra["token_ids"]
    text = "".join(ch.choices[0].delta.content or "" for ch in body)
    assert text == full.choices[0].message.content
    lps = [lp.logprob for ch in body for lp in ch.choices[0].logprobs.content]
    assert lps == pytest.approx([lp.logprob for lp in full.choices[0].logprobs.content], abs=1e-5)
    assert [ch.choices[0].finish_reason for ch in body][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_seed_determinism_and_n(engine):
    c = client(engine)
    kw = {
        "model": "tiny",
        "messages": MSGS,
        "max_tokens": 12,
        "temperature": 1.0,
        "n": 3,
        "seed": 1234,
        "extra_body": {"return_token_ids": True, "ignore_eos": True},
    }
    a = c.chat.completions.create(**kw)
    b = c.chat.completions.create(**kw)
    ids_a = [ch.model_extra["token_ids"] for ch in a.choices]
    assert ids_a == [ch.model_extra["token_ids"] for ch in b.choices]
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    assert len({tuple(x) for x in ids_a}) > 1, "n choices with one seed should still differ"
    other = c.chat.completions.create(**{**kw, "seed": 99})
    assert [ch.model_extra["token_ids"] for ch in other.choices] != ids_a
    assert a.usage.completion_tokens == 36


def test_stop_string_cuts_text_not_tokens(engine):
    c = client(engine)
    base = c.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    text = base.choices[0].message.content
    stop = text[3:6]
    assert stop and stop in text
    r = c.chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=20,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop
    assert r.choices[0].message.content == text[: text.index(stop)]
    streamed = c.chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=20,
        temperature=0,
        stop=[stop],
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert (
        "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices)
        == text[: text.index(stop)]
    )


def test_token_in_completions(engine):
    chat = client(engine).chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    prompt_ids = chat.model_extra["prompt_token_ids"]
    r = client(engine).completions.create(
        model="tiny",
        prompt=prompt_ids,
        max_tokens=5,
        temperature=0,
        logprobs=2,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = r.choices[0]
    assert choice.model_extra["prompt_token_ids"] == prompt_ids
    assert choice.model_extra["token_ids"] == chat.choices[0].model_extra["token_ids"]
    assert choice.logprobs.token_logprobs == pytest.approx(
        [c.logprob for c in chat.choices[0].logprobs.content], abs=1e-5
    )
    assert all(len(t) <= 3 for t in choice.logprobs.top_logprobs)
    stream = list(
        client(engine).completions.create(
            model="tiny",
            prompt=prompt_ids,
            max_tokens=5,
            temperature=0,
            stream=True,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
    )
    assert [t for ch in stream for t in ch.choices[0].model_extra["token_ids"]] == choice.model_extra[
        "token_ids"
    ]
    assert stream[0].choices[0].model_extra["prompt_token_ids"] == prompt_ids


async def test_concurrent_requests_are_batched(engine):
    stats = httpx.AsyncClient(base_url=engine.url)
    before = (await stats.get("/stats")).json()
    aclient = openai.AsyncOpenAI(base_url=engine.base_url, api_key="x", max_retries=0)
    results = await asyncio.gather(
        *[
            aclient.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"request {i}"}],
                max_tokens=16,
                temperature=0,
                extra_body={"ignore_eos": True, "return_token_ids": True},
            )
            for i in range(8)
        ]
    )
    assert all(len(r.choices[0].model_extra["token_ids"]) == 16 for r in results)
    after = (await stats.get("/stats")).json()
    await stats.aclose()
    assert after["multi_seq_steps"] > before["multi_seq_steps"]
    assert after["max_batch_size"] >= 4
    # 8 requests x 16 tokens in far fewer steps than one at a time would need
    assert after["steps"] - before["steps"] < 8 * 16


def test_batched_greedy_equals_alone(engine):
    """Left padding in the batch cache must not change what a sequence generates."""
    c = client(engine)
    kw = {
        "model": "tiny",
        "max_tokens": 10,
        "temperature": 0,
        "extra_body": {"ignore_eos": True, "return_token_ids": True},
    }
    long_msgs = [{"role": "user", "content": "a much longer prompt " * 20}]
    alone = c.chat.completions.create(messages=MSGS, **kw).choices[0].model_extra["token_ids"]

    async def together():
        ac = openai.AsyncOpenAI(base_url=engine.base_url, api_key="x", max_retries=0)
        return await asyncio.gather(
            ac.chat.completions.create(messages=long_msgs, **kw),
            ac.chat.completions.create(messages=MSGS, **kw),
        )

    _, short = asyncio.run(together())
    assert short.choices[0].model_extra["token_ids"] == alone


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": "nope", "messages": MSGS}, 404, "model_not_found"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, 400, 400),
        ({"model": "tiny", "messages": "hello"}, 400, 400),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "x " * 5000}]},
            400,
            "context_length_exceeded",
        ),
        ({"model": "tiny", "messages": MSGS, "temperature": -1}, 400, 400),
        ({"model": "tiny", "messages": MSGS, "tool_choice": "sometimes"}, 400, 400),
    ],
)
def test_errors_are_openai_json(engine, body, status, code):
    r = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=60)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["message"]


def test_completions_rejects_out_of_vocab_ids(engine):
    with pytest.raises(openai.BadRequestError):
        client(engine).completions.create(model="tiny", prompt=[10**9], max_tokens=2)


def test_weight_update_changes_outputs_and_bumps_version(engine, tmp_path):
    import torch

    from polar_pl.engine.weights import save_state_dict

    c = client(engine)
    kw = {
        "model": "tiny",
        "messages": MSGS,
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "extra_body": {"ignore_eos": True, "return_token_ids": True},
    }
    before = c.chat.completions.create(**kw)
    v0 = engine.policy_version()
    original = {k: v.clone() for k, v in engine.backend.model.state_dict().items()}
    changed = {k: v + 0.05 * torch.randn_like(v) for k, v in original.items() if v.dim() == 2}
    try:
        assert engine.update_weights_from_state_dict(changed) == v0 + 1
        after = c.chat.completions.with_raw_response.create(**kw)
        assert after.headers["x-policy-version"] == str(v0 + 1)
        parsed = after.parse()
        assert parsed.model_extra["policy_version"] == v0 + 1
        assert [x.logprob for x in parsed.choices[0].logprobs.content] != [
            x.logprob for x in before.choices[0].logprobs.content
        ]
        # From disk, over HTTP: back to the original weights, same outputs as before.
        save_state_dict(original, tmp_path)
        auth = {"authorization": f"Bearer {engine.admin_token}"}
        r = httpx.post(
            f"{engine.url}/update_weights_from_disk", json={"path": str(tmp_path)}, headers=auth, timeout=120
        )
        assert r.status_code == 200 and r.json()["policy_version"] == v0 + 2
        again = c.chat.completions.create(**kw)
        assert again.choices[0].model_extra["token_ids"] == before.choices[0].model_extra["token_ids"]
        assert again.model_extra["policy_version"] == v0 + 2
    finally:
        engine.update_weights_from_state_dict(original)
    bad = httpx.post(
        f"{engine.url}/update_weights_from_disk", json={"path": str(tmp_path / "missing")}, headers=auth
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "path"


def test_real_tool_call_parse(tool_engine, tool_case):
    """A model trained to call write_file: the engine parses its hermes output into tool_calls."""
    c = client(tool_engine)
    TOOL_MESSAGES, TOOLS, TOOL_ARGS = tool_case.messages, tool_case.tools, tool_case.args
    r = c.chat.completions.create(
        model="tool", messages=TOOL_MESSAGES, tools=TOOLS, temperature=0, max_tokens=80
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will write it.\n"
    (call,) = choice.message.tool_calls
    assert call.function.name == "write_file" and json.loads(call.function.arguments) == TOOL_ARGS
    chunks = list(
        c.chat.completions.create(
            model="tool", messages=TOOL_MESSAGES, tools=TOOLS, temperature=0, max_tokens=80, stream=True
        )
    )
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas if d.function.name] == ["write_file"]
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == TOOL_ARGS
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == [
        "tool_calls"
    ]
    # tool_choice "none": the same text comes back as plain content
    plain = c.chat.completions.create(
        model="tool", messages=TOOL_MESSAGES, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=80
    )
    assert plain.choices[0].finish_reason == "stop" and "<tool_call>" in plain.choices[0].message.content


def test_client_disconnect_aborts_generation(engine):
    """A stream the client abandons must stop consuming batch slots."""
    import time

    body = {"model": "tiny", "messages": MSGS, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{engine.base_url}/chat/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 3:
                break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats = httpx.get(f"{engine.url}/stats").json()
        if stats.get("active_sequences") == 0 and stats.get("active_requests") == 0:
            break
        time.sleep(0.1)
    assert stats["active_sequences"] == 0 and stats["active_requests"] == 0
