"""Prompt shutdown of a training run on SIGTERM / SIGINT.

Lightning's own SIGTERM handler only notes the signal; the run went on (new harnesses started 30 s
and 48 s later, exit after 127 s, finalised as "success" with no checkpoint). Here the first
signal, at once: admits no new rollout and cancels the running ones (their sandboxes, and so their
harnesses, are stopped), and asks the trainer to stop after the step in progress. When the
trainer stops, a checkpoint is written; `train()` then finalises the loggers as "killed" and exits
with 128 + the signal's number. A watchdog exits the process `grace_s` after the signal whatever is
still running; a second signal exits at once. A run that ends because the engine or the gateway
stopped answering (`PartDown`) gets the same checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from polar_pl.rollout.service import PartDown

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """Raised by the signal handler while the run is still being set up (nothing to checkpoint)."""


class Interruptible(Protocol):
    def interrupt(self, harness_grace_s: float) -> None:
        """Admit no new rollout and cancel the running ones; returns at once (a signal handler)."""


class GracefulShutdown(L.Callback):
    """See the module docstring. rollouts: what the first signal interrupts (the run's runtime).
    checkpoint: where the shutdown checkpoint goes. grace_s: the signal-to-exit deadline."""

    def __init__(
        self,
        rollouts: Interruptible,
        checkpoint: str | Path,
        grace_s: float = 30.0,
        harness_grace_s: float = 10.0,
    ) -> None:
        if grace_s <= 0 or harness_grace_s < 0:
            raise ValueError(
                f"shutdown.grace_s={grace_s!r} / harness_grace_s={harness_grace_s!r}: must be > 0"
            )
        self.rollouts, self.checkpoint = rollouts, Path(checkpoint)
        self.grace_s, self.harness_grace_s = grace_s, harness_grace_s
        self.signum: int | None = None
        self.t0 = 0.0
        self.trainer: L.Trainer | None = None
        self.saved: Path | None = None
        self._previous: dict[int, Any] = {}

    @property
    def exit_code(self) -> int | None:
        return None if self.signum is None else 128 + self.signum

    def install(self) -> None:
        """Take SIGTERM and SIGINT (main thread only). Called before the run is built and again
        when training starts: Lightning puts its own SIGTERM handler in place at fit start."""
        for sig in SIGNALS:
            previous = signal.signal(sig, self._on_signal)
            self._previous.setdefault(sig, previous)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            log.error("%s again: exiting now", name)
            os._exit(128 + signum)
        self.signum, self.t0 = signum, time.monotonic()
        log.warning(
            "%s: no new rollouts, running harnesses cancelled; checkpoint, then exit (at most %.0f s)",
            name,
            self.grace_s,
        )
        threading.Thread(target=self._watchdog, name="shutdown-watchdog", daemon=True).start()
        self.rollouts.interrupt(self.harness_grace_s)
        if self.trainer is None:
            raise Interrupted(name)  # still setting up: unwind through its cleanup
        self.trainer.should_stop = True

    def _watchdog(self) -> None:
        time.sleep(self.grace_s)
        log.error("still running %.0f s after the signal: exiting now", self.grace_s)
        logging.shutdown()
        os._exit(self.exit_code or 1)

    # ---- Lightning hooks ----------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.trainer = trainer
        self.install()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.signum is None:
            return
        ckpt = trainer.checkpoint_callback
        if (
            isinstance(ckpt, ModelCheckpoint) and ckpt.save_last and ckpt.dirpath
        ):  # writes last.ckpt after this hook
            self.saved = Path(ckpt.dirpath) / "last.ckpt"
            log.warning("shutdown checkpoint: %s (resume with ckpt_path=...)", self.saved)
        else:
            self._save(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self.trainer is not None and (self.signum is not None or isinstance(exception, PartDown)):
            self._save(trainer)  # the trainer is sound: the run can resume where it stopped

    def _save(self, trainer: L.Trainer) -> None:
        if self.saved is not None:
            return
        try:
            trainer.save_checkpoint(self.checkpoint)
        except Exception:
            log.exception("shutdown checkpoint failed")
            return
        self.saved = self.checkpoint
        log.warning("shutdown checkpoint: %s (resume with ckpt_path=%s)", self.checkpoint, self.checkpoint)
