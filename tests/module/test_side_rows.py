"""Side calls through GRPOModule.update for every builder: rows built from real trace records with
a title call per session train without the 'rows of one rollout disagree on reward or group'
crash (issues 14 and 15: OpenCode, Claude Code titles, Qwen memory, Gemini router)."""

from __future__ import annotations

import pytest
import torch
from small_model import small_model

from polar_pl.datamodule.collate import collate
from polar_pl.gateway.store.records import TraceRecord
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings
from polar_pl.trajectory import PerRequestBuilder, PrefixBuilder

REWARDS = [1.0, 0.0, 0.5, 0.0]


def record(session: str, idx: int, prompt: list[int], response: list[int], kind: str = "main") -> TraceRecord:
    return TraceRecord(
        session_id=session, call_index=idx, timestamp=float(idx), provider="openai_chat", raw_request={},
        raw_response="", normalized_request={"temperature": 0.8}, prompt_ids=prompt, response_ids=response,
        response_logprobs=[-1.0] * len(response), finish_reason="stop", policy_version=0, latency_s=0.0,
        group_id="g", rollout_id=f"{session}-r", call_kind=kind,
    )  # fmt: skip


def session(k: int) -> list[TraceRecord]:
    """Two main calls (the second extends the first) and a title side call."""
    p1, r1 = [1, 2, 3, 4], [10 + k, 11, 2]
    p2 = p1 + r1 + [3, 5, 6]
    return [
        record(f"s{k}", 0, p1, r1),
        record(f"s{k}", 1, [1, 7, 8, 3], [20 + k, 2], kind="side"),
        record(f"s{k}", 2, p2, [30 + k, 31, 2]),
    ]


def rows(builder):
    return [row for k, r in enumerate(REWARDS) for row in builder.build(session(k), reward=r).rows]


@pytest.mark.parametrize("builder", [PerRequestBuilder, PrefixBuilder])
@pytest.mark.parametrize("inherit", [False, True])
def test_side_rows_train_as_their_own_rollouts(builder, inherit) -> None:
    built = rows(builder(side_calls_inherit_reward=inherit))
    side = [r.meta["call_kind"] == "side" for r in built]
    assert sum(side) == 4 and {r.reward for r, s in zip(built, side, strict=True) if s} == (
        set(REWARDS) if inherit else {0.0}
    )
    batch = collate(built, token_budget=32)
    model = small_model()
    m = GRPOModule(model=model).update(batch, torch.optim.SGD(model.parameters(), lr=0.1))
    assert m["train/optimizer_steps"] == 1.0
    assert (m["train/rollouts"], m["train/side_rollouts"]) == (4.0, 4.0)
    adv = batch.advantages.tolist()
    main_adv = {r.rollout_id: a for r, a, s in zip(built, adv, side, strict=True) if not s}
    for r, a, s in zip(built, adv, side, strict=True):
        if s:  # the side group (constant side_reward) has no signal; inherited, it mirrors the task
            assert a == pytest.approx(main_adv[r.rollout_id] if inherit else 0.0, abs=1e-5)
    sampled_side = sum(sum(r.loss_mask) for r, s in zip(built, side, strict=True) if s)
    expected = sum(sum(r.loss_mask) for r in built) - (0 if inherit else sampled_side)
    assert m["train/trainable_tokens"] == expected


def test_side_rows_excluded_by_config() -> None:
    built = rows(PrefixBuilder(side_calls_inherit_reward=True))
    model = small_model()
    batch = collate(built, token_budget=32)
    m = GRPOModule(model=model, settings=GRPOSettings(side_rows="exclude")).update(
        batch, torch.optim.SGD(model.parameters(), lr=0.1)
    )
    assert (m["train/rollouts"], m["train/side_rollouts"]) == (4.0, 0.0)
    side = [r.meta["call_kind"] == "side" for r in built]
    assert [a for a, s in zip(batch.advantages.tolist(), side, strict=True) if s] == [0.0] * 4
    assert m["train/trainable_tokens"] == sum(
        sum(r.loss_mask) for r in built if r.meta["call_kind"] == "main"
    )
