"""Fail fast: a run whose first rollouts all fail the same way stops, and says why.

A broken setup (a sandbox that cannot start, a harness that cannot run) fails every attempt within
a second, and a group of failed attempts has no rows to train on, so the trainer drew group after
group for ever: a run at 80% CPU with no step and no line after the first rollout's. Here the
first `after` finished attempts (in the order their groups reach the trainer) are watched: when
they all ended in the same infrastructure failure, `RolloutsFailing` stops the run with that
failure as its reason. One attempt that worked, or a different failure, and the watch ends: a
run that works at all is never stopped by it.

Infrastructure failures are those nothing the policy did caused: a stage that raised (status
`failed`: the sandbox, the workspace, the evaluator), an `infra_failure`, or a harness error the
records blame on the harness or the engine (outcome.py). Two failures are the same when they
happened in the same stage with the same exception type (or harness exit): their messages may
still differ in a temporary path or a pid.
"""

from __future__ import annotations

from collections.abc import Iterable

from polar_pl.errors import RunFailed
from polar_pl.rollout.outcome import INFRA
from polar_pl.rollout.pools import FAILED, HARNESS_ERROR, INFRA_FAILURE, RolloutResult


class RolloutsFailing(RunFailed):
    """The first rollouts of the run all failed the same way: no rollout can work."""


def infra_failure(result: RolloutResult) -> tuple[str, ...] | None:
    """(status, stage, kind) of an attempt that failed for infrastructure reasons, else None.
    kind: the exception type ("RuntimeError") or the harness's exit ("exit 127")."""
    infra = result.status in (FAILED, INFRA_FAILURE) or (
        result.status == HARNESS_ERROR and result.info.harness_error == INFRA
    )
    if not infra:
        return None
    kind = (result.error or "").split(":", 1)[0]
    return (result.status, result.failed_stage or "", kind)


class FailFast:
    """Watches the first `after` results (0: never stops a run)."""

    def __init__(self, after: int) -> None:
        if after < 0:
            raise ValueError(f"datamodule.fail_fast_after={after}: must be >= 0 (0: off)")
        self.after = after
        self.seen = 0
        self.same: tuple[str, ...] | None = None
        self.watching = after > 0

    def see(self, results: Iterable[RolloutResult]) -> None:
        """Called with each group's results as the trainer takes them; raises `RolloutsFailing`
        when the first `after` all failed the same way."""
        for result in results:
            if not self.watching:
                return
            failure = infra_failure(result)
            if failure is None or (self.same is not None and failure != self.same):
                self.watching = False
                return
            self.same, self.seen = failure, self.seen + 1
            if self.seen >= self.after:
                self.watching = False
                raise RolloutsFailing(_reason(self.seen, result))


def _reason(n: int, last: RolloutResult) -> str:
    where = f" in {last.failed_stage.upper()}" if last.failed_stage else ""
    return f"the first {n} rollouts all failed{where} the same way, so none can work: {last.error}"
