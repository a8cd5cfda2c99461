"""Real harness CLIs (Claude Code over Anthropic, pi over OpenAI Chat, and the mini agent) doing
three model turns (tool call, tool call, answer) through the gateway: with token-faithful prompts
on, the session's main line merges into one chain with zero drift, its prompts built incrementally
and checked against full renders; with it off, the first turn's re-render drifts. Both with the
tiny model's tokenizer and template and with SmolLM2-135M-Instruct's (49k vocabulary, its own
ChatML template with tools in the system turn)."""

from __future__ import annotations

import itertools

import pytest

from polar_pl.testing.clitrace import ANSWER, run_cli_session

CLIS = ["claude_code", "pi"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CLIS)
def test_real_cli_three_turns_zero_drift_with_faithful_prompts(name, tiny_model_dir) -> None:
    check_three_turns(name, tiny_model_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mini", *CLIS])
def test_real_model_three_turns_zero_drift_with_faithful_prompts(name, smollm2_model_dir) -> None:
    check_three_turns(name, smollm2_model_dir)


def check_three_turns(name: str, model_dir) -> None:
    runs = {}
    for faithful in (True, False):
        try:
            tr = run_cli_session(name, token_faithful=faithful, model_dir=model_dir, check=True)
        except FileNotFoundError as exc:
            pytest.skip(str(exc))
        assert tr.exit_code == 0, tr.detail
        assert tr.result_file == "part1part2", tr.detail
        main = tr.main_calls
        assert len(main) >= 3 and all(r.status == "ok" for r in main), [(r.status, r.error) for r in main]
        assert tr.answer and ANSWER in tr.answer, tr.detail
        runs[faithful] = tr
    on, off = runs[True].stats, runs[False].stats
    print(
        f"\n{name}: on  calls={on.calls} rows={on.rows} ratio={on.compression_ratio:.2f} breaks={on.breaks}"
    )
    print(
        f"{name}: off calls={off.calls} rows={off.rows} ratio={off.compression_ratio:.2f} breaks={off.breaks}"
    )
    assert "drift" not in on.breaks and on.spliced_calls >= 1
    # the calls after the first extend the chain incrementally, with the full render's ids
    g = runs[True].gateway_stats
    assert g["gateway/faithful/incremental"] >= 2 and g["gateway/faithful/mismatch"] == 0
    assert off.breaks.get("drift", 0) >= 1
    assert on.compression_ratio > off.compression_ratio
    # the main line is one chain: every main call after the first extends the one before
    mains = runs[True].main_calls
    for a, b in itertools.pairwise(mains):
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
