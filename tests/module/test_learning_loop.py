"""The closed loop at module level: sample from the embedded engine, reward, GRPO step, push.
With the push the reward climbs within a few steps; with NoSync the engine keeps sampling from the
initial weights, the reward stays flat and the trainer drifts away from the engine's logprobs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from module_rows import prompt_ids, sample_group

from polar_pl.datamodule.collate import collate
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.weight_sync import EmbeddedStateDictSync, NoSync

TARGET = frozenset(range(0, 8192, 8))  # one token id in 8: an untrained model samples ~12% of them
# The reward takes off after a slow start whose length depends on the samples (step 5 to 11 over
# three sampling seeds at lr 3e-2; up to step 16 at lr 1e-2): 16 steps leave a margin.
STEPS = 16
PROMPT = 6


def run(tiny_model_dir, engine, sync) -> tuple[list[float], list[float]]:
    """(mean reward, trainer-vs-engine logprob gap) per step."""
    module = GRPOModule(tiny_model_dir, lr=3e-2, weight_sync=sync.bind(engine))
    opt = module.configure_optimizers()
    rewards, gaps = [], []
    for step in range(STEPS):
        rows = []
        for g in range(4):
            group = sample_group(
                engine, f"{step}-{g}", prompt_ids(PROMPT, g), size=8, max_tokens=8, seed=100 * step + g
            )
            rows += [replace(r, reward=sum(t in TARGET for t in r.input_ids[PROMPT:]) / 8) for r in group]
        rewards.append(sum(r.reward for r in rows) / len(rows))
        gaps.append(module.update(collate(rows, token_budget=64), opt).get("train/logprob_gap_mean", 0.0))
    return rewards, gaps


@pytest.mark.slow
def test_reward_climbs_only_when_weights_reach_the_engine(tiny_model_dir, fresh_engine) -> None:
    rewards, gaps = run(tiny_model_dir, fresh_engine, EmbeddedStateDictSync())
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.3, rewards
    assert max(gaps) < 0.01, gaps  # every batch was sampled by the weights the trainer holds

    fresh_engine.update_weights_from_state_dict(GRPOModule(tiny_model_dir).model.state_dict())
    flat, drift = run(tiny_model_dir, fresh_engine, NoSync())
    assert sum(flat[-3:]) / 3 < sum(flat[:3]) / 3 + 0.15, flat
    assert drift[-1] > 0.1, drift
