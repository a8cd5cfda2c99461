"""The fuzz pass (polar_pl.testing.fuzz) over the four APIs, with and without a max_tokens cap:
no 5xx, no traceback, every error in the provider's shape, every model call recorded."""

from __future__ import annotations

import pytest

from polar_pl.testing.fuzz import failures, run_pass


@pytest.mark.parametrize("cap", [None, 64])
def test_a_fuzz_pass_gives_no_5xx_and_no_traceback(tiny_model_dir, tmp_path, cap):
    """With --max-tokens-cap, `"max_output_tokens": "16"` (or [16], {"n": 16}) was a 500 with a
    traceback: the cap's min() ran on the string (60 of 12,340 fuzz calls, issue 32)."""
    result = run_pass("chat", 240, seed=32, concurrency=8, model_dir=tiny_model_dir, out=tmp_path, cap=cap)
    assert result["model calls"] > 150 and result["4xx"] > 100 and result["2xx"] > 20, result
    assert failures(result) == 0, str(result)
