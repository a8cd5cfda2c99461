"""pass@k and its interval: the estimator against brute force, the interval's coverage, pairing."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from polar_pl.eval.stats import Estimate, paired, pass_at_k, summarize


@pytest.mark.parametrize(("n", "c", "k"), [(4, 0, 1), (4, 1, 1), (4, 1, 2), (5, 2, 3), (6, 6, 4), (8, 3, 8)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_pass(n, c, k) -> None:
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_bad_counts_are_refused() -> None:
    for n, c, k in ((2, 3, 1), (2, 1, 3), (2, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_interval_covers_the_true_rate() -> None:
    """95% intervals over 300 tasks of a known pass rate cover it about 95% of the time."""
    rng = random.Random(0)
    covered = 0
    for _ in range(400):
        rates = [rng.random() ** 2 for _ in range(300)]  # tasks of varied difficulty, mean 1/3
        counts = {str(i): (4, sum(rng.random() < p for _ in range(4))) for i, p in enumerate(rates)}
        est = summarize(counts, [1])[1]
        covered += est.low <= 1 / 3 <= est.high
    assert 0.92 <= covered / 400 <= 0.98


def test_paired_difference_is_tighter_than_separate_intervals() -> None:
    rng = random.Random(1)
    base = {str(i): rng.random() for i in range(300)}  # task difficulty dominates the spread
    after = {t: min(1.0, p + 0.05 + rng.gauss(0, 0.02)) for t, p in base.items()}
    diff = paired(base, after)
    separate = Estimate.of(list(after.values()))
    assert diff.low > 0 and diff.high - diff.low < (separate.high - separate.low) / 5
    assert diff.mean == pytest.approx(sum(after[t] - base[t] for t in base) / 300)
    assert paired({"a": 1.0}, {"b": 1.0}).tasks == 0 and math.isnan(paired({}, {}).mean)


def test_interval_is_clipped_to_what_a_rate_can_be() -> None:
    est = Estimate.of([0.0, 0.0, 1.0])
    assert est.low == 0.0 and 0 < est.high <= 1.0
