"""Literal token-list cases for each merge rule and each chain-break kind."""

from __future__ import annotations

from dataclasses import replace

import pytest
from traj_tokens import GEN, NL, E, rec, system, tool_result, user

from polar_pl.trajectory import PerRequestBuilder, PrefixBuilder, TrajectoryBuilder, build_batch

P1 = system(100) + user(101, 102) + GEN
R1 = [200, 201, E]
MSGS1 = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def build(records, **kw):
    return PrefixBuilder(**kw).build(records, reward=1.0)


def test_clean_extension_is_one_row_with_both_responses_trainable() -> None:
    p2 = P1 + R1 + [NL] + user(103) + GEN
    r2 = [202, E]
    res = build([rec(0, P1, R1), rec(1, p2, r2, version=3)])
    (row,) = res.rows
    assert row.input_ids == p2 + r2
    n1, n2 = len(P1), len(p2)
    assert row.loss_mask == [0] * n1 + [1, 1, 1] + [0] * (n2 - n1 - 3) + [1, 1]
    assert row.behavior_logprobs[n1 : n1 + 3] == [-1.0, -1.01, -1.02]
    assert row.behavior_logprobs[n2:] == [-2.0, -2.01]
    assert row.policy_version[n1 : n1 + 3] == [0, 0, 0] and row.policy_version[n2:] == [3, 3]
    assert row.call_indices == (0, 1) and row.reward == 1.0 and row.meta["start"] == "first"
    assert res.stats.rows == 1 and res.stats.num_breaks == 0
    assert res.stats.call_tokens == len(P1) + 3 + len(p2) + 2
    assert res.stats.compression_ratio == pytest.approx(res.stats.call_tokens / len(row.input_ids))


def test_tool_result_interstitial_is_masked_with_zero_logprob() -> None:
    call = [300, 301, 302, E]  # a sampled <tool_call> ... </tool_call><|im_end|>
    glue = [NL] + tool_result(400, 401) + GEN
    p2 = P1 + call + glue
    res = build([rec(0, P1, call), rec(1, p2, [203, E])])
    (row,) = res.rows
    s = len(P1) + len(call)
    assert row.input_ids[s : s + len(glue)] == glue
    assert row.loss_mask[s : s + len(glue)] == [0] * len(glue)
    assert row.behavior_logprobs[s : s + len(glue)] == [0.0] * len(glue)
    assert row.policy_version[s : s + len(glue)] == [-1] * len(glue)
    assert sum(row.loss_mask) == len(call) + 2


def test_truncated_response_continues_and_unsampled_im_end_is_glue() -> None:
    cut = [200, 201]  # finish_reason length: no <|im_end|> was sampled
    p2 = P1 + cut + [E, NL] + user(103) + GEN
    res = build([rec(0, P1, cut, finish="length"), rec(1, p2, [202, E])])
    (row,) = res.rows
    im_end_pos = len(P1) + 2
    assert row.input_ids[im_end_pos] == E
    assert row.loss_mask[im_end_pos] == 0 and row.behavior_logprobs[im_end_pos] == 0.0
    assert sum(row.loss_mask) == 4


def test_truncated_response_dropped_by_harness_is_a_truncation_break() -> None:
    p2 = P1 + [E, NL] + user(103) + GEN  # the harness threw the cut turn away
    res = build([rec(0, P1, [200, 201], finish="length"), rec(1, p2, [202, E])])
    assert len(res.rows) == 2 and res.stats.breaks == {"truncation": 1}
    assert res.rows[1].meta["start"] == "truncation"


def test_drift_after_a_length_cut_response_is_drift_not_truncation() -> None:
    """classify_break checked truncation first, so a re-render that changed a kept, length-cut
    turn was labelled truncation and drift on real traces was under-reported."""
    cut = [200, 201]
    m2 = [*MSGS1, {"role": "assistant", "content": "cut"}, {"role": "user", "content": "go on"}]
    p2 = P1 + [200, 299, E, NL] + user(103) + GEN  # the cut turn re-rendered to other tokens
    by_messages = build([rec(0, P1, cut, finish="length", messages=MSGS1), rec(1, p2, [202, E], messages=m2)])
    assert by_messages.stats.breaks == {"drift": 1}
    by_tokens = build([rec(0, P1, cut, finish="length"), rec(1, p2, [202, E])])
    assert by_tokens.stats.breaks == {"drift": 1}
    dropped = [*MSGS1, {"role": "user", "content": "go on"}]  # the harness threw the cut turn away
    p3 = P1 + [E, NL] + user(103) + GEN
    res = build([rec(0, P1, cut, finish="length", messages=MSGS1), rec(1, p3, [202, E], messages=dropped)])
    assert res.stats.breaks == {"truncation": 1}


def test_compaction_rewrites_history() -> None:
    m2 = [*MSGS1, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
    p2 = P1 + R1 + [NL] + user(103) + GEN
    m3 = [*MSGS1, {"role": "user", "content": "summary of the work so far"}]
    p3 = P1[:-3] + user(150, 151) + GEN
    res = build(
        [rec(0, P1, R1, messages=MSGS1), rec(1, p2, [202, E], messages=m2), rec(2, p3, [204, E], messages=m3)]
    )
    assert [r.call_indices for r in res.rows] == [(0, 1), (2,)]
    assert res.stats.breaks == {"compaction": 1}


def test_interleaved_subagent_keeps_both_chains() -> None:
    b1 = system(500) + user(501) + GEN
    a2 = P1 + R1 + [NL] + tool_result(400) + GEN
    rb1 = [600, E]
    b2 = b1 + rb1 + [NL] + tool_result(401) + GEN
    ra2 = [203, E]
    a3 = a2 + ra2 + [NL] + tool_result(402) + GEN
    records = [
        rec(0, P1, R1, messages=MSGS1),
        rec(1, b1, rb1, messages=[{"role": "system", "content": "sub"}, {"role": "user", "content": "x"}]),
        rec(2, a2, ra2),
        rec(3, b2, [601, E]),
        rec(4, a3, [204, E]),
    ]
    res = build(records)
    assert [r.call_indices for r in res.rows] == [(0, 2, 4), (1, 3)]
    assert res.stats.breaks == {"new_conversation": 1}
    assert res.rows[1].meta["start"] == "new_conversation"


def test_new_conversation_by_tokens_when_messages_are_absent() -> None:
    b1 = system(500) + user(501) + GEN
    res = build([rec(0, P1, R1), rec(1, b1, [600, E])])
    assert res.stats.breaks == {"new_conversation": 1}


DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


def test_rows_record_each_calls_span_finish_and_sampling() -> None:
    """The trainer rebuilds each call's sampling distribution and segment from meta["calls"]."""
    p2 = P1 + R1 + [NL] + user(103) + GEN
    first = replace(rec(0, P1, R1), normalized_request={"temperature": 0.7, "top_p": 0.5, "top_k": 0})
    (row,) = build([first, rec(1, p2, [202, E], finish="length")]).rows
    assert row.meta["calls"] == [
        {
            "start": len(P1),
            "finish_reason": "stop",
            "sampling": {"temperature": 0.7, "top_p": 0.5, "top_k": -1},
        },
        {"start": len(p2), "finish_reason": "length", "sampling": DEFAULT_SAMPLING},
    ]


def test_side_call_never_joins_and_gets_no_reward_by_default() -> None:
    side_prompt = P1 + R1  # even if it happens to extend the task chain
    p2 = P1 + R1 + [NL] + user(103) + GEN
    records = [rec(0, P1, R1), rec(1, side_prompt + GEN, [700, E], kind="side"), rec(2, p2, [202, E])]
    res = build(records)
    assert [r.call_indices for r in res.rows] == [(0, 2), (1,)]
    assert [r.reward for r in res.rows] == [1.0, 0.0]
    calls = [{"start": len(side_prompt + GEN), "finish_reason": "stop", "sampling": DEFAULT_SAMPLING}]
    assert res.rows[1].meta == {
        "call_kind": "side",
        "num_calls": 1,
        "calls": calls,
        "start": "side_call",
        "chain": 1,
    }
    assert res.stats.breaks == {"side_call": 1}
    inherit = build(records, side_calls_inherit_reward=True)
    assert [r.reward for r in inherit.rows] == [1.0, 1.0]
    dropped = build(records, include_side_calls=False)
    assert [r.call_indices for r in dropped.rows] == [(0, 2)] and dropped.stats.skipped_calls == 1


def test_drift_same_messages_different_tokens() -> None:
    m2 = [*MSGS1, {"role": "assistant", "content": "ab"}, {"role": "user", "content": "next"}]
    rerendered = [200, 250, E]  # the template re-tokenized the sampled turn
    p2 = P1 + rerendered + [NL] + user(103) + GEN
    res = build([rec(0, P1, R1, messages=MSGS1), rec(1, p2, [202, E], messages=m2)])
    assert res.stats.breaks == {"drift": 1}
    # per_request trains each sampled token once as well, without the break
    pr = PerRequestBuilder().build([rec(0, P1, R1), rec(1, p2, [202, E])])
    assert pr.stats.rows == 2 and pr.stats.compression_ratio == 1.0


def test_drift_by_tokens_inside_last_response() -> None:
    p2 = P1 + [200, 250, E, NL] + user(103) + GEN
    res = build([rec(0, P1, R1), rec(1, p2, [202, E])])
    assert res.stats.breaks == {"drift": 1}


def test_aborted_call_then_retry_is_an_error_break() -> None:
    p2 = P1 + R1 + [NL] + user(103) + GEN
    records = [rec(0, P1, R1), rec(1, p2, [202], status="aborted", finish=None), rec(2, p2, [203, E])]
    res = build(records)
    assert [r.call_indices for r in res.rows] == [(0, 1), (2,)]
    assert res.stats.breaks == {"error": 1}


def test_failed_call_with_nothing_sampled_is_skipped_and_retry_extends() -> None:
    p2 = P1 + R1 + [NL] + user(103) + GEN
    records = [rec(0, P1, R1), rec(1, p2, [], status="error", error="engine 503"), rec(2, p2, [203, E])]
    res = build(records)
    assert [r.call_indices for r in res.rows] == [(0, 2)]
    assert res.stats.skipped_calls == 1 and res.stats.num_breaks == 0


def test_context_overflow_then_compaction_is_truncation() -> None:
    p2 = P1 + R1 + [NL] + user(103) + GEN
    p3 = P1[:-3] + user(150) + GEN
    records = [
        rec(0, P1, R1),
        rec(1, p2, [], status="error", error="This model's maximum context length is 32768 tokens"),
        rec(2, p3, [203, E]),
    ]
    assert build(records).stats.breaks == {"truncation": 1}
    records[1] = rec(1, p2, [], status="error", error="engine 503")
    assert build(records).stats.breaks == {"error": 1}


def test_call_joins_the_longest_chain_it_extends() -> None:
    # call 1 re-asks call 0's prompt (a break); its answer continues call 0's, so chain 1's tokens
    # extend chain 0's and call 2 extends both: it joins the longer one.
    res = build([rec(0, P1, R1), rec(1, P1, [*R1, 205]), rec(2, P1 + R1 + [205, NL] + GEN, [206, E])])
    assert [r.call_indices for r in res.rows] == [(0,), (1, 2)]


def test_policy_versions_per_token_and_spliced_count() -> None:
    p2 = P1 + R1 + [NL] + user(103) + GEN
    res = build([rec(0, P1, R1, versions=[4, 4, 5]), rec(1, p2, [202, E], rendered=p2[:-1] + [99])])
    (row,) = res.rows
    s = len(P1)
    assert row.policy_version[s : s + 3] == [4, 4, 5]
    assert res.stats.spliced_calls == 1


def test_malformed_record_is_a_value_error() -> None:
    bad = rec(0, P1, R1, logprobs=[-1.0])
    with pytest.raises(ValueError, match="3 response_ids but 1 response_logprobs"):
        build([bad])
    with pytest.raises(ValueError, match="several sessions"):
        build([rec(0, P1, R1), rec(1, P1, R1, session="s2")])


def test_records_are_merged_in_call_index_order() -> None:
    p2 = P1 + R1 + [NL] + user(103) + GEN
    res = build([rec(1, p2, [202, E]), rec(0, P1, R1)])
    assert [r.call_indices for r in res.rows] == [(0, 1)]


def test_batch_stats_sum_sessions_and_flatten_to_metrics() -> None:
    p2 = P1 + R1 + [NL] + user(103) + GEN
    records = [rec(0, P1, R1, session="a"), rec(1, p2, [202, E], session="a")]
    records += [rec(0, P1, R1, session="b"), rec(1, P1[:-3] + user(9) + GEN, [203, E], session="b")]
    res = build_batch(PrefixBuilder(), records, rewards={"a": 1.0, "b": -1.0})
    assert [(r.session_id, r.reward) for r in res.rows] == [("a", 1.0), ("b", -1.0), ("b", -1.0)]
    s = res.stats
    assert (s.sessions, s.calls, s.rows, s.breaks) == (2, 4, 3, {"new_conversation": 1})
    m = s.to_metrics()
    assert m["merge/rows"] == 3 and m["merge/breaks/new_conversation"] == 1 and m["merge/breaks/drift"] == 0
    assert m["merge/compression_ratio"] == pytest.approx(s.call_tokens / s.row_tokens)
    assert isinstance(PrefixBuilder(), TrajectoryBuilder) and isinstance(
        PerRequestBuilder(), TrajectoryBuilder
    )
