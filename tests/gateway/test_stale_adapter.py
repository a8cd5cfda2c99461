"""The gateway asks for the adapter the engine serves now (issue 58): when the name it last read
is refused as gone (the engine pushed a newer adapter before the gateway heard of it), it reads
the engine's models again and sends the call once more under the current name. The harness gets
its answer, and the record keeps the name that was sampled from with the version that sampled."""

from __future__ import annotations

import openai
import pytest
from adapter_kit import push_adapter

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.gateway.handle import Gateway
from polar_pl.utils.adapters import adapter_version


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with EmbeddedEngine(tiny_model_dir, served_model_name="tiny", max_batch_size=4, max_model_len=512) as eng:
        yield eng


def test_a_call_under_an_adapter_name_the_engine_dropped_is_sent_again_under_the_current_one(
    engine, tmp_path
) -> None:
    """Failure guarded: the gateway kept asking for `tiny-lora-v1` after v2 was pushed (it read the
    name before the push), and the record said ('tiny-lora-v1', 2)."""
    v1 = push_adapter(engine, seed=1, target="v_proj")
    with Gateway([engine.url], tmp_path / "t.db") as gw:
        s = gw.create_session()
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
        ask = [{"role": "user", "content": "hi"}]
        for stream in (False, True):
            answer = client.chat.completions.create(model="m", messages=ask, max_tokens=3, stream=stream)
            list(answer) if stream else answer  # a stream is read to its end before the next push
            v = push_adapter(engine, seed=v1 + 10, target="v_proj")  # the gateway is not told
        last = client.chat.completions.create(model="m", messages=ask, max_tokens=3)
        records = gw.records(s.session_id)
    assert last.choices[0].message.content is not None
    served = [(r.normalized_request["model"], r.policy_version, r.status) for r in records]
    assert served == [
        (f"tiny-lora-v{v1}", v1, "ok"), (f"tiny-lora-v{v1 + 1}", v1 + 1, "ok"), (f"tiny-lora-v{v}", v, "ok"),
    ], served  # fmt: skip
    assert all(adapter_version(m) == v for m, v, _ in served)
