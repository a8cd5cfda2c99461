"""Property tests: merging never loses, duplicates or alters a sampled token."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from traj_sessions import clean_sessions, sessions

from polar_pl.datamodule.collate import collate, unpack
from polar_pl.gateway.store.records import TraceRecord
from polar_pl.trajectory import FIRST, PerRequestBuilder, PrefixBuilder


def _sampled(records: list[TraceRecord]) -> list[TraceRecord]:
    return [r for r in records if r.status == "ok" or r.response_ids]


def _trainable(rows) -> Counter:
    return Counter(
        (t, lp, v)
        for row in rows
        for t, m, lp, v in zip(
            row.input_ids, row.loss_mask, row.behavior_logprobs, row.policy_version, strict=True
        )
        if m
    )


@settings(max_examples=300, deadline=None)
@given(sessions)
def test_prefix_keeps_every_sampled_token_exactly_once(records: list[TraceRecord]) -> None:
    res = PrefixBuilder().build(records)
    where = {i: row for row in res.rows for i in row.call_indices}
    assert sum(len(row.call_indices) for row in res.rows) == len(where)  # no call in two rows
    calls = _sampled(records)
    assert set(where) == {r.call_index for r in calls}
    for r in calls:
        row, s, n = where[r.call_index], len(r.prompt_ids), len(r.response_ids)
        assert row.input_ids[s : s + n] == r.response_ids
        assert row.loss_mask[s : s + n] == [1] * n
        assert row.behavior_logprobs[s : s + n] == r.response_logprobs
        assert row.policy_version[s : s + n] == r.token_policy_versions
    # and nothing else is trainable: the masked positions are exactly those spans
    assert sum(sum(row.loss_mask) for row in res.rows) == sum(len(r.response_ids) for r in calls)
    for row in res.rows:
        for m, lp, v in zip(row.loss_mask, row.behavior_logprobs, row.policy_version, strict=True):
            assert m or (lp == 0.0 and v == -1)
    has_main = any(r.call_kind == "main" for r in calls)
    assert res.stats.rows == res.stats.num_breaks + has_main
    assert sum(row.meta["start"] == FIRST for row in res.rows) == has_main
    assert res.stats.sampled_tokens == sum(len(r.response_ids) for r in calls)


@settings(max_examples=200, deadline=None)
@given(sessions)
def test_per_request_and_prefix_train_the_same_tokens(records: list[TraceRecord]) -> None:
    pr, px = PerRequestBuilder().build(records), PrefixBuilder().build(records)
    assert _trainable(pr.rows) == _trainable(px.rows)
    assert pr.stats.call_tokens == px.stats.call_tokens
    assert px.stats.row_tokens <= pr.stats.row_tokens


@settings(max_examples=200, deadline=None)
@given(clean_sessions)
def test_without_breaks_prefix_is_one_row_with_per_request_tokens(records: list[TraceRecord]) -> None:
    pr, px = PerRequestBuilder().build(records), PrefixBuilder().build(records)
    assert px.stats.num_breaks == 0 and len(px.rows) == 1
    assert px.rows[0].input_ids == records[-1].prompt_ids + records[-1].response_ids
    assert _trainable(pr.rows) == _trainable(px.rows)
    assert px.stats.compression_ratio >= 1.0


@settings(max_examples=200, deadline=None)
@given(sessions, sessions)
def test_pack_then_unpack_returns_the_rows(a: list[TraceRecord], b: list[TraceRecord]) -> None:
    rows = PrefixBuilder().build(a, reward=1.0).rows + PerRequestBuilder().build(b, reward=-0.5).rows
    longest = max(len(r.input_ids) for r in rows)
    for batch in (
        collate(rows, mode="pack", token_budget=longest + 7),
        collate(rows, mode="pack", token_budget=longest),
        collate(rows, mode="pad", pad_to_multiple_of=8),
    ):
        assert unpack(batch) == rows
        assert batch.padding_tokens == batch.total_tokens - sum(len(r.input_ids) for r in rows)
