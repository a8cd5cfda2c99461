"""Each engine call states the sampling settings the trainer rebuilds (temperature, top_p, top_k),
in the engine request and in the record; settings the trainer cannot reproduce are dropped with
a note; `sampling="pinned"` sends 1 / 1 / off whatever the harness asked."""

from __future__ import annotations

import openai
import pytest

from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import Reply, serve_scripted


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with serve_scripted(lambda chat: Reply("ok"), model_dir=tiny_model_dir) as srv:
        yield srv


def calls(engine, tmp_path, tiny_model_dir, policy: str, faithful: bool, **options):
    engine.backend.requests.clear()
    with Gateway(
        [engine.url], tmp_path / f"{policy}-{faithful}.db", tokenizer_dir=tiny_model_dir,
        token_faithful=faithful, sampling=policy, **options,
    ) as gw:  # fmt: skip
        s = gw.create_session()
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        client.chat.completions.create(
            model="m", messages=msgs, temperature=0.7, top_p=0.5, presence_penalty=0.3
        )
        client.chat.completions.create(model="m", messages=msgs, extra_body={"top_k": 5, "min_p": 0.0})
        client.chat.completions.create(model="m", messages=msgs)
        records = gw.records(s.session_id)
    sent = [(r.params.temperature, r.params.top_p, r.params.top_k) for r in engine.backend.requests]
    recorded = [tuple(r.normalized_request[k] for k in ("temperature", "top_p", "top_k")) for r in records]
    return sent, recorded, [r.notes for r in records]


@pytest.mark.parametrize("faithful", [False, True])
def test_recorded_settings_are_explicit(engine, tmp_path, tiny_model_dir, faithful) -> None:
    sent, recorded, notes = calls(engine, tmp_path, tiny_model_dir, "recorded", faithful)
    assert sent == recorded == [(0.7, 0.5, -1), (1.0, 1.0, 5), (1.0, 1.0, -1)]
    assert any("dropped presence_penalty=0.3" in n for n in notes[0])
    assert not any("dropped" in n for n in notes[1] + notes[2])  # min_p 0 does nothing: no note


def test_pinned_sends_the_raw_distribution(engine, tmp_path, tiny_model_dir) -> None:
    sent, recorded, notes = calls(engine, tmp_path, tiny_model_dir, "pinned", True)
    assert sent == recorded == [(1.0, 1.0, -1)] * 3
    assert (
        "sampling pinned: temperature 0.7 -> 1.0" in notes[0] and "sampling pinned: top_k 5 -> -1" in notes[1]
    )


def test_pinned_at_a_run_chosen_temperature(engine, tmp_path, tiny_model_dir) -> None:
    """The run, not each CLI, picks what the policy samples from (a real model rambles at 1.0)."""
    sent, recorded, notes = calls(engine, tmp_path, tiny_model_dir, "pinned", True, pinned_temperature=0.6)
    assert sent == recorded == [(0.6, 1.0, -1)] * 3
    assert "sampling pinned: temperature 0.7 -> 0.6" in notes[
        0
    ] and "sampling pinned: temperature 1.0" not in str(notes)
    with pytest.raises(ValueError, match="pinned_temperature"):
        Gateway([engine.url], tmp_path / "t.db", pinned_temperature=0)


def test_unknown_policy_names_the_option(engine, tmp_path) -> None:
    with pytest.raises(ValueError, match="sampling='greedy': allowed recorded, pinned"):
        Gateway([engine.url], tmp_path / "t.db", sampling="greedy")
