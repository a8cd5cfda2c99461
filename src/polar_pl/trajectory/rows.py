"""The trajectory row: what a builder emits and the trainer consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class TrajectoryRow:
    """One trainable sequence.

    input_ids: (T,) prompt and response tokens of one call (per_request) or one merged chain.
    loss_mask: (T,) 1 exactly on tokens the policy sampled, 0 on prompt / tool results / glue.
    behavior_logprobs: (T,) engine logprob of each sampled token, 0.0 where loss_mask is 0.
    policy_version: (T,) policy version that sampled each token, -1 where loss_mask is 0.
    rollout_id: one task attempt; several rows may share it (a rollout split into chains).
    The token fields are lists, or 1-D numpy arrays when the rows were built from records read
    packed from the store (collate takes either).
    group_id: the GRPO group (all attempts at one task in one step).
    """

    input_ids: list[int]
    loss_mask: list[int]
    behavior_logprobs: list[float]
    policy_version: list[int]
    session_id: str
    rollout_id: str
    group_id: str
    reward: float = 0.0
    call_indices: tuple[int, ...] = ()
    harness: str | None = None
    status: str = "ok"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        assert len(self.loss_mask) == n and len(self.behavior_logprobs) == n and len(self.policy_version) == n

    @property
    def num_trainable(self) -> int:
        m = self.loss_mask
        return int(np.count_nonzero(m)) if isinstance(m, np.ndarray) else sum(m)  # no list -> array copy
