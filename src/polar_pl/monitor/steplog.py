"""One plain line per training step, and the step-time breakdown logged as `time/*`.

The line goes through `logging` (Hydra prints it and writes it to the run's train.log), so it
reads the same in a terminal, where rich's live table of stage counts redraws below it, and in a
log file or CI, where nothing redraws:

    step 3/20 | reward 0.412 ± 0.210 | pass 0.12 | tokens 384 | 7.9 s (wait 4.1, old 0.3, update 0.9, push 0.0) | v3 | engine 45%

Time of one step, from the end of the previous one (the first: from the start of training):
time/rollout_wait_s  the trainer blocked on rollouts (Lightning fetches a batch one step ahead, so
                     this is the wait for the next batch, taken inside this step's window);
time/old_logprobs_s, time/update_s, time/push_s  the GRPO step's parts (module train/*_s);
time/other_s         the rest (collation, logging, checkpoints); time/step_s the total.
The first step's window starts when the engine and gateway are up, so it holds the first waits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import lightning as L

from polar_pl.rollout.runtime import feed_of

log = logging.getLogger("polar_pl.train")


def _num(metrics: Mapping[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def step_times(metrics: Mapping[str, Any], step_s: float, wait_s: float) -> dict[str, float]:
    """time/* of one step from the module's logged train/*_s and the measured wall times."""
    parts = {
        "time/rollout_wait_s": wait_s,
        "time/old_logprobs_s": _num(metrics, "train/old_logprob_s") or 0.0,
        "time/update_s": _num(metrics, "train/update_s") or 0.0,
        "time/push_s": _num(metrics, "train/push_s") or 0.0,
    }
    parts["time/other_s"] = max(0.0, step_s - sum(parts.values()))
    parts["time/step_s"] = step_s
    return parts


def step_line(step: int, total: int | None, m: Mapping[str, Any]) -> str:
    """The per-step line from one step's metrics (rollout/*, train/*, time/*)."""

    def f(key: str, fmt: str, default: str = "-") -> str:
        v = _num(m, key)
        return default if v is None else format(v, fmt)

    std = _num(m, "rollout/reward_std")
    reward = f("rollout/reward_mean", ".3f") + (f" ± {std:.3f}" if std is not None else "")
    times = ", ".join(
        f"{name} {f(f'time/{key}', '.1f')}"
        for name, key in (
            ("wait", "rollout_wait_s"),
            ("old", "old_logprobs_s"),
            ("update", "update_s"),
            ("push", "push_s"),
        )
    )
    version = f("train/policy_version", ".0f")
    busy = _num(m, "rollout/engine_busy")
    line = (
        f"step {step}/{total or '?'} | reward {reward} | pass {f('rollout/pass_rate', '.2f')}"
        f" | tokens {f('rollout/trainable_tokens', '.0f')} | {f('time/step_s', '.1f')} s ({times})"
        f" | v{version}"
    )
    if busy is not None:
        line += f" | engine {busy:.0%}"
    if _num(m, "train/skipped"):
        line += " | skipped: nothing to train on (equal rewards in every group, or no sampled tokens)"
    return line


class StepLog(L.Callback):
    """Logs time/* and prints the step line after every training step.

    total: the run length in steps for the "step k/N" display (None: the datamodule's `steps`).
    """

    def __init__(self, total: int | None = None) -> None:
        self.total = total
        self._t_last: float | None = None
        self._wait_last = 0.0
        self.history: list[dict[str, float]] = []
        self._step = 0
        self._global_step = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # After the datamodule's setup (engine and gateway up): the first step's window holds the
        # wait for the first two batches (Lightning fetches one ahead).
        self._t_last = time.monotonic()
        feed = feed_of(trainer)
        self._wait_last = feed.wait_total_s if feed is not None else 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        feed = feed_of(trainer)
        self._step = feed.batches_done if feed is not None else batch_idx  # before commit
        self._global_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.monotonic()
        feed = feed_of(trainer)
        wait_total = feed.wait_total_s if feed is not None else 0.0
        step_s = now - (self._t_last if self._t_last is not None else now)
        metrics = {k: _num(trainer.callback_metrics, k) for k in trainer.callback_metrics}
        # callback_metrics keep a key's last value: a skipped batch (no optimiser step) logs no
        # train/*_s of its own, and train/skipped would stick to every later step.
        skipped = trainer.global_step == self._global_step
        metrics["train/skipped"] = 1.0 if skipped else None
        if skipped:
            metrics.update({"train/old_logprob_s": 0.0, "train/update_s": 0.0, "train/push_s": 0.0})
        times = step_times(metrics, step_s, wait_total - self._wait_last)
        self._t_last, self._wait_last = now, wait_total
        pl_module.log_dict(times, on_step=True, on_epoch=False, batch_size=1)
        merged = {**{k: v for k, v in metrics.items() if v is not None}, **times}
        self.history.append(merged)
        total = self.total or (feed.steps if feed is not None else None)
        if trainer.is_global_zero:  # one line per step, not one per rank
            log.info(step_line(self._step + 1, total, merged))
