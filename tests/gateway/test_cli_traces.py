"""Real harness CLIs (Claude Code over Anthropic, pi over OpenAI Chat) doing three model turns
(tool call, tool call, answer) through the gateway: with token-faithful prompts on, the session's
main line merges into one chain with zero drift; with it off, the first turn's re-render drifts."""

from __future__ import annotations

import itertools

import pytest

from polar_pl.testing.clitrace import ANSWER, run_cli_session

CLIS = ["claude_code", "pi"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CLIS)
def test_real_cli_three_turns_zero_drift_with_faithful_prompts(name, tiny_model_dir) -> None:
    runs = {}
    for faithful in (True, False):
        try:
            tr = run_cli_session(name, token_faithful=faithful, model_dir=tiny_model_dir)
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
    assert off.breaks.get("drift", 0) >= 1
    assert on.compression_ratio > off.compression_ratio
    # the main line is one chain: every main call after the first extends the one before
    mains = runs[True].main_calls
    for a, b in itertools.pairwise(mains):
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
