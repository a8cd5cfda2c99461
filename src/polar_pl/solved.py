"""Ending a run that has nothing left to learn.

When every rollout of a step passes, every group's rewards are equal: GRPO's advantages are all
zero and the step trains nothing (the batch is skipped), and the next step samples from the same
weights. After `patience` such steps in a row the run stops as if it had reached `steps`: its end
callbacks (held-out evaluation, export, plots) still run.
"""

from __future__ import annotations

import logging

import lightning as L

log = logging.getLogger("polar_pl.train")


class StopWhenSolved(L.Callback):
    """Stops training after `patience` consecutive steps whose rollouts all passed
    (`rollout/pass_rate` 1.0). patience None: never."""

    def __init__(self, patience: int | None = 5) -> None:
        if patience is not None and patience < 1:
            raise ValueError(f"callbacks.stop_when_solved.patience: must be >= 1 or null, got {patience}")
        self.patience = patience
        self.streak = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.patience is None:
            return
        rate = trainer.callback_metrics.get("rollout/pass_rate")
        self.streak = self.streak + 1 if rate is not None and float(rate) >= 1.0 else 0
        if self.streak >= self.patience and not trainer.should_stop:
            log.info(
                "every rollout passed for %d steps in a row: nothing left to learn, the run ends", self.streak
            )
            trainer.should_stop = True
