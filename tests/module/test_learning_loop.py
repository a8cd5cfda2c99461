"""The closed loop at module level: sample from the embedded engine, reward, GRPO step, push.
With the push the reward climbs within a few steps; with NoSync the engine keeps sampling from the
initial weights, the reward stays flat and the trainer drifts away from the engine's logprobs.
The multi-turn loop runs real sessions through the gateway (polar_pl.testing.multiturn)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from module_rows import prompt_ids, sample_group

from polar_pl.datamodule.collate import collate
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import EmbeddedStateDictSync, NoSync
from polar_pl.tasks.learnable import LearnableTaskSource
from polar_pl.testing.multiturn import learn

TARGET = frozenset(range(0, 8192, 8))  # one token id in 8: an untrained model samples ~12% of them
# The reward takes off after a slow start whose length depends on the samples (step 5 to 11 over
# three sampling seeds at lr 3e-2; up to step 16 at lr 1e-2): 16 steps leave a margin.
STEPS = 16
PROMPT = 6


def run(tiny_model_dir, engine, sync) -> tuple[list[float], list[float]]:
    """(mean reward, trainer-vs-engine logprob gap) per step."""
    module = GRPOModule(tiny_model_dir, weight_sync=sync.bind(engine), settings=GRPOSettings(lr=3e-2))
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


# The multi-turn check, sized by measurement (bench/multiturn_learning.py --seed N): two capitals
# and two lowercase groups of 8 per step (with one of each, a step's single capitals group swung
# 0.0-0.9 and seeds 2 and 3 fell back onto one case), Adam at 3e-3 (1e-2 collapsed the warm model
# onto lowercase in three updates; 5e-3 reached 0.97 and then collapsed onto capitals). The bars
# hold for every run measured, on two machines whose numerics give different sample paths from
# the same seed (seeds 1-5 each; the test runs seed 1, whichever machine CI lands on):
#                         machine A (2026-12-01)         machine B (2026-12-02)
#   lead over control     +0.25 .. +0.31                 +0.15 +0.21 +0.19 +0.30 +0.18
#   weaker case, last 3   0.92 .. 0.97                   0.66  0.80  0.76  0.98  0.74
#   min entropy           0.94 .. 1.04                   0.63  0.20  0.97  0.80  0.62
# On B capitals rise slower (seed 1: 0.48 -> 0.66 while lowercase reaches 1.0) and seed 5 swung
# onto capitals for a step (lowercase 0.49 at step 10) before both recovered.
MULTITURN = {"group_size": 8, "groups_per_step": 4, "seed": 1}
NOTES = {"work_turns": 2, "title": True, "note_tokens": 8, "extra": {"max_tokens": 16}}
LEAD = 0.1  # the push run's last 3 steps over the control's mean (a control step varies +-0.03)
EACH_CASE = 0.6  # both cases at once: a prompt-blind policy has capitals + lowercase <= 1
ENTROPY_FLOOR = 0.1  # nats per sampled token; collapsed untrained runs hit 0.01


@pytest.mark.slow
def test_multiturn_sessions_learn_to_read_the_prompt(multiturn_model_dir, fresh_engine, tmp_path) -> None:
    """Sessions with the structure real harnesses have (a title side call, then three calls: two
    notes answered by observations restating the task, and the answer), through the real gateway,
    prefix-merged into one row with masked observation turns plus a side row. The `case` task asks
    for capitals or lowercase by prompt, so a policy collapsed onto one case scores 0.5: the reward
    rises above the no-push control only if the policy reads the prompt, and it must rise for both
    cases. The model starts warm (warmstart/multiturn_warmstart.py: it follows the asked case for
    ~70% of the letters); the untrained one races collapse and is not a reliable check."""
    tasks = LearnableTaskSource(kind="case", n_tasks=8).tasks()
    model = str(multiturn_model_dir)
    initial = GRPOModule(model).model.state_dict()

    def run(sync, steps: int):
        fresh_engine.update_weights_from_state_dict(initial)
        module = GRPOModule(model, weight_sync=sync.bind(fresh_engine), settings=GRPOSettings(lr=3e-3))
        return learn(
            module, fresh_engine, tasks, tmp_path / f"{steps}.db", steps=steps, notes=NOTES, **MULTITURN
        )

    push = run(EmbeddedStateDictSync(), 12)
    control = run(NoSync(), 4)  # the engine keeps the warm weights: a flat estimate of their reward
    assert all(kinds == ["side", "main", "main", "main"] for kinds in push.calls)
    assert set(push.rows_per_session) == {2} and set(push.side_rollouts) == {32}  # merged + side row
    start = sum(control.reward) / len(control.reward)  # measured 0.66-0.69 (0.64-0.72 a step)
    assert sum(push.reward[-3:]) / 3 > start + LEAD, (push.reward, control.reward)
    for check, values in push.by_check.items():
        assert sum(values[-3:]) / 3 > EACH_CASE, (check, push.by_check, control.by_check)
    assert min(push.entropy) > ENTROPY_FLOOR, push.entropy
