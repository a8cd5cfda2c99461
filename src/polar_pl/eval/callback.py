"""`HeldOutEval`: the held-out evaluation before and after a training run, on the run's own engine.

Before the first step (the engine still serves the starting weights) and after the last one (the
final policy pushed), every task of the held-out split is attempted n times through the run's
harness, sandboxes and evaluator (`run.run_eval`, with a gateway of its own in front of the run's
engine); the training rollouts are stopped first, so nothing else competes for the engine. Writes
`<out_dir>/before/`, `<out_dir>/after/` and the paired comparison in `<out_dir>/`, logs
`eval/before/pass@k`, `eval/after/pass@k` and `eval/pass@1_gain` (with its interval), and prints
the table. A resumed run finds `before/` done and does not redo it; an interrupted run skips `after`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L

from polar_pl.eval.report import EvalReport, compare
from polar_pl.eval.run import EvalSpec, run_eval
from polar_pl.rollout.runtime import RolloutRuntime, feed_of
from polar_pl.tasks.sources import TaskSource

log = logging.getLogger("polar_pl.train")


class HeldOutEval(L.Callback):
    """tasks: the held-out task source (e.g. the `arith` family's test split); n: attempts per
    task; ks: the pass@k reported; limit: only the first `limit` tasks (null: all)."""

    def __init__(
        self,
        tasks: TaskSource,
        out_dir: str,
        n: int = 4,
        ks: tuple[int, ...] = (1,),
        threshold: float = 1.0,
        before: bool = True,
        after: bool = True,
        limit: int | None = None,
    ) -> None:
        self.tasks = tasks.tasks()[:limit] if limit else tasks.tasks()
        self.out_dir = Path(out_dir)
        self.spec = EvalSpec(n=n, ks=tuple(ks), threshold=threshold)
        self.before, self.after = before, after
        self.reports: dict[str, EvalReport] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.before and trainer.global_rank == 0:
            self._evaluate(trainer, "before")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.after or trainer.global_rank != 0:
            return
        runtime = _runtime(trainer)
        if runtime.interrupted:
            return
        runtime.stop_rollouts()
        self._evaluate(trainer, "after")
        if "before" in self.reports:
            comparison = compare(self.reports["before"], self.reports["after"])
            comparison.write(self.out_dir)
            d = comparison.diff
            _log(
                trainer,
                {"eval/pass@1_gain": d.mean, "eval/pass@1_gain_low": d.low, "eval/pass@1_gain_high": d.high},
            )
            log.info("held-out evaluation (%s):\n%s", self.out_dir, comparison.table())

    def _evaluate(self, trainer: L.Trainer, label: str) -> None:
        log.info("held-out evaluation %s: %d tasks x %d attempts", label, len(self.tasks), self.spec.n)
        report = run_eval(_runtime(trainer), self.tasks, self.spec, self.out_dir / label, label=label)
        self.reports[label] = report
        _log(trainer, report.metrics(f"eval/{label}"))
        log.info("held-out evaluation %s:\n%s", label, report.table())


def _runtime(trainer: L.Trainer) -> RolloutRuntime:
    feed = feed_of(trainer)
    if feed is None:
        raise ValueError(
            "callbacks.held_out_eval: the held-out evaluation runs on a RolloutDataModule's runtime"
        )
    return feed.runtime


def _log(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
