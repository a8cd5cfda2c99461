"""Harness outcome is not the answer: failed runs are labelled by cause, never scored."""

from __future__ import annotations

import dataclasses

from traj_tokens import rec

from polar_pl.rollout.outcome import INFRA, POLICY, classify

CLAUDE_CAP_ERROR = "API Error: Claude's response exceeded the 128000 output token maximum."


def test_exit_after_a_capped_response_is_the_policys_fault():
    """Claude Code exits 1 when its last response was cut by the cap: the run was scored on the
    error message (reward 0.248, the message's uppercase share); now it is a policy-caused
    harness_error, trained with reward 0, and the text is not an answer."""
    records = [rec(0, [1, 2], [5, 6], finish="length")]
    out = classify(1, "", CLAUDE_CAP_ERROR, records)
    assert out.failed and out.cause == POLICY
    assert "exit 1" in out.reason and "response cap" in out.reason


def test_api_error_is_infrastructure_even_with_exit_zero():
    """A harness that got an error from the model API is a harness_error (masked), whatever its
    exit code says: its printed answer is the error."""
    records = [rec(0, [1, 2], [5], status="error", error="upstream 502: engine unavailable")]
    out = classify(0, "", "Error: 502", records)
    assert out.cause == INFRA and "502" in out.reason


def test_exit_without_any_model_call_is_infrastructure():
    """Gemini CLI exit 41 "Invalid auth method selected." before any call: not the policy."""
    out = classify(41, "Invalid auth method selected.", "", [])
    assert out.cause == INFRA and "no model call" in out.reason and "Invalid auth" in out.reason


def test_unexplained_exit_is_masked_and_malformed_call_is_policy():
    clean = rec(0, [1, 2], [5, 6])
    assert classify(2, "TypeError: undefined", "", [clean]).cause == INFRA
    noted = dataclasses.replace(clean, notes=("malformed tool call: name not among the tools",))
    assert classify(1, "", "", [noted]).cause == POLICY


def test_clean_run_and_side_calls():
    assert not classify(0, "", "ANSWER", [rec(0, [1], [2]), rec(1, [3], [4], kind="side")]).failed
    # a capped side call does not make the main line the policy's fault
    side_cut = [rec(0, [1], [2]), rec(1, [3], [4], kind="side", finish="length")]
    assert classify(1, "boom", "", side_cut).cause == INFRA


def test_a_harness_names_its_policy_exit_codes():
    """The mini agent's exit 3 (out of turns: the model kept calling tools) is the policy's doing."""
    records = [rec(0, [1, 2], [5, 6], finish="tool_calls")]
    assert classify(3, "", "", records, {3: "out of turns"}).cause == POLICY
    assert classify(3, "", "", records).cause == INFRA
