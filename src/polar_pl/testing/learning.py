"""The CLI learning check's measure, one definition for tests/test_train.py and
bench/cli_learning.py: a push run against a no-push control of the same experiment."""

from __future__ import annotations

# The control: the engine keeps the start's weights. It only estimates the start's reward, so
# groups of 8 suffice (Claude Code's push runs use 16), and its updates, never pushed, are thrown
# away: one epoch and no KL reference make them the cheapest the trainer runs.
CONTROL_OVERRIDES = (
    "module/weight_sync=none",
    "datamodule.group_size=8",
    "module.epochs=1",
    "module.kl_coef=0.0",
)


def start_and_lead(push: list[float], control: list[float]) -> tuple[float, float]:
    """Mean reward by step in, (start, lead) out: the start pools the control's steps with the
    push run's first (sampled before any update); the lead is the push run's last 3 steps over it."""
    start = (sum(control) + push[0]) / (len(control) + 1)
    return start, sum(push[-3:]) / 3 - start
