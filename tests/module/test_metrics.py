"""Batch metrics by hand: logprob gap, ratio quantiles, staleness, entropy; rewards per harness
count each rollout once however many rows it has."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from polar_pl.datamodule.collate import collate
from polar_pl.module.metrics import batch_metrics, harness_metrics, numeric, unit_metrics
from polar_pl.module.rollouts import Rollouts
from polar_pl.trajectory.rows import TrajectoryRow

L = math.log


def test_gap_ratio_quantiles_and_staleness() -> None:
    old = torch.tensor([[L(0.5), L(0.5), L(0.5), 0.0]])
    behavior = torch.tensor([[L(0.25), L(0.5), L(1.0), -40.0]], dtype=torch.float64)
    sampled = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is prompt: its wild gap is ignored
    m = batch_metrics(
        old=old, behavior=behavior, sampled=sampled, mask=sampled, entropy=torch.tensor([[1.0, 2.0, 3.0, 99.0]]),
        token_versions=torch.tensor([[3, 4, 5, -1]]), current_version=5, tis_w=torch.tensor([[2.0, 1.0, 0.5, 0.0]]),
    )  # fmt: skip
    assert m["train/logprob_gap_mean"] == pytest.approx(2 * L(2) / 3)
    # ratios exp(old - behavior) = [2, 1, 0.5]; linear interpolation at 0.1, 1.0 and 1.9 of the sorted list.
    assert (m["train/ratio_p05"], m["train/ratio_p50"], m["train/ratio_p95"]) == pytest.approx(
        (0.55, 1.0, 1.9)
    )
    assert (m["train/staleness_mean"], m["train/staleness_max"]) == (1.0, 2.0)
    assert m["train/entropy"] == pytest.approx(2.0) and m["train/tis_weight_mean"] == pytest.approx(3.5 / 3)


def row(rollout: str, reward: float, harness: str, kind: str = "main") -> TrajectoryRow:
    return TrajectoryRow(
        [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [-1, 0, 0], "s", rollout, "g", reward, harness=harness,
        meta={"call_kind": kind},
    )  # fmt: skip


def test_harness_rewards_count_rollouts_once() -> None:
    rows = [row("a1", 1.0, "codex"), row("a1", 1.0, "codex"), row("a2", 0.0, "codex"), row("b1", 0.5, "pi"),
            row("a1", 0.0, "codex", kind="side")]  # fmt: skip
    m = harness_metrics(collate(rows, token_budget=8))
    # codex: rollouts a1 (split into two rows, plus a title row at side_reward 0, which used to
    # overwrite its reward) and a2 -> mean 0.5, not (1 + 1 + 0) / 3 nor 0.
    assert m["rollout/reward_mean/codex"] == 0.5 and m["rollout/pass_rate/codex"] == 0.5
    assert m["rollout/reward_std/codex"] == pytest.approx(math.sqrt(0.5))
    assert m["rollout/reward_mean/pi"] == 0.5 and "rollout/reward_std/pi" not in m


def test_numeric_keeps_loggable_values() -> None:
    assert numeric({"a": 1, "b": 2.5, "c": "x", "d": torch.tensor(3.0), "e": [1], "f": True}) == {
        "a": 1.0, "b": 2.5, "d": 3.0, "f": 1.0,
    }  # fmt: skip


def test_harness_rewards_are_reduced_in_float64() -> None:
    """The reported mean and std are those of the rollouts' (float32) rewards computed in float64,
    not a float32 reduction that is off in the 8th digit."""
    rows = [row(f"r{i}", x, "codex") for i, x in enumerate([0.1, 0.2, 0.7, 0.35])]
    batch = collate(rows, token_budget=16)
    rewards = [float(x) for x in batch.rewards]
    m = harness_metrics(batch)
    assert m["rollout/reward_mean/codex"] == statistics.fmean(rewards)
    assert m["rollout/reward_std/codex"] == pytest.approx(statistics.stdev(rewards), rel=1e-12)


def test_batch_metrics_without_sampled_tokens_and_optional_inputs() -> None:
    zeros = torch.zeros(1, 3)
    args = {"old": zeros, "behavior": zeros.double(), "sampled": zeros, "mask": zeros,
            "token_versions": torch.zeros(1, 3, dtype=torch.long), "current_version": 2}  # fmt: skip
    assert batch_metrics(entropy=None, **args) == {}
    m = batch_metrics(entropy=torch.ones(1, 3), tis_w=torch.ones(1, 3), keep_w=torch.ones(1, 3), **args)
    assert m == {"train/entropy": 0.0, "train/tis_weight_mean": 0.0, "train/off_policy_masked_frac": 1.0}


def test_off_policy_masked_fraction_over_loss_tokens() -> None:
    sampled = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    m = batch_metrics(
        old=torch.zeros(1, 4), behavior=torch.zeros(1, 4, dtype=torch.float64), sampled=sampled, mask=mask,
        entropy=None, token_versions=torch.tensor([[0, 1, 1, 1]]), current_version=1,
        keep_w=torch.tensor([[1.0, 0.0, 1.0, 0.0]]),
    )  # fmt: skip
    assert m["train/off_policy_masked_frac"] == pytest.approx(1 / 3)
    assert (m["train/staleness_mean"], m["train/staleness_max"]) == (0.25, 1.0)
    assert m["train/logprob_gap_mean"] == 0.0 and m["train/ratio_p50"] == 1.0


def test_unit_metrics_count_units_not_rows() -> None:
    units = Rollouts(
        row=torch.tensor([0, 0, 1, 3]), reward=torch.tensor([1.0, 0.0, 0.0, 0.0]),
        group=torch.tensor([0, 0, -1, 1]), side=torch.tensor([False, False, True, True]), ids=["a", "b", "a/side", "b/side"],
    )  # fmt: skip
    adv = torch.tensor([0.5, -1.5, 9.0, 0.25])  # unit 2 has no rows: not counted
    m = unit_metrics(units, adv, torch.tensor([0.2, 0.4, 9.0, 0.0], dtype=torch.float64), truncated_calls=3)
    assert m == pytest.approx({
        "train/advantage_abs_mean": 0.75, "train/rollouts": 2.0, "train/side_rollouts": 1.0,
        "train/truncated_calls": 3.0, "train/kl_reward_penalty_mean": 0.2,
    })  # fmt: skip
    none = Rollouts(torch.tensor([-1]), torch.zeros(1), torch.tensor([-1]), torch.tensor([False]), ["a"])
    assert unit_metrics(none, torch.zeros(1), None, 0) == {
        "train/advantage_abs_mean": 0.0, "train/rollouts": 0.0, "train/side_rollouts": 0.0, "train/truncated_calls": 0.0,
    }  # fmt: skip


def test_means_over_a_single_token() -> None:
    one = torch.tensor([[0.0, 1.0]])
    m = batch_metrics(
        old=torch.zeros(1, 2), behavior=torch.zeros(1, 2, dtype=torch.float64), sampled=one, mask=one,
        entropy=torch.tensor([[5.0, 3.0]]), token_versions=torch.zeros(1, 2, dtype=torch.long), current_version=0,
        tis_w=torch.tensor([[9.0, 1.5]]),
    )  # fmt: skip
    assert (m["train/entropy"], m["train/tis_weight_mean"]) == (3.0, 1.5)
