"""Held-out evaluation: n sampled attempts at every task of a split, through a harness, scored by
the task's evaluator in the training sandboxes; pass@1 / pass@k with 95% intervals.

The attempts run in the same `RolloutService` and `HarnessRolloutStages` as training (INIT,
RUNNING, POSTRUN in their pools, one group of n attempts per task), against a gateway of the
evaluation's own in front of the engine that serves the model, so an evaluated attempt is exactly
a training attempt that nothing trains on. Each finished task is appended to `rollouts.jsonl` in
the output directory before the next one is taken (`RolloutLog`): a run stopped at any point
resumes where it stopped when it is started again on the same directory.

An attempt whose infrastructure failed (sandbox, engine, gateway: `failfast.infra_failure`, the
attempts training never scores) says nothing about the model: it is logged but left out of pass@k,
and counted. When the first task's attempts all fail alike, nothing can work: the evaluation stops
with that failure (`FailFast`, as a training run does) before it records anything.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_pl.datamodule.failfast import FailFast, infra_failure
from polar_pl.eval.report import EvalReport, build_report
from polar_pl.gateway.handle import Gateway
from polar_pl.rollout.pools import RolloutResult
from polar_pl.rollout.runtime import RolloutRuntime
from polar_pl.rollout.service import Group, RolloutService
from polar_pl.sft.log import RolloutLog

log = logging.getLogger(__name__)
ANSWER_CHARS = 2000  # an answer is kept in the log up to this length (the trace store has it whole)


@dataclass(frozen=True, slots=True)
class EvalSpec:
    """n: attempts per task; ks: the pass@k reported (each <= n); threshold: an attempt passes when
    its reward reaches it; group_timeout_s: give up when no task finishes for this long."""

    n: int = 4
    ks: tuple[int, ...] = (1,)
    threshold: float = 1.0
    group_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"eval.n={self.n}: needs at least one attempt per task")
        bad = [k for k in self.ks if not 1 <= k <= self.n]
        if bad:
            raise ValueError(f"eval.ks={list(self.ks)}: each k must be in [1, eval.n={self.n}]")


def attempt_record(result: RolloutResult, threshold: float) -> dict[str, Any]:
    answer = result.info.answer
    return {
        "rollout_id": result.rollout_id,
        "status": result.status,
        "reward": result.reward,
        "passed": result.reward >= threshold and infra_failure(result) is None,
        "valid": infra_failure(result) is None,
        "answer": answer[:ANSWER_CHARS] if answer is not None else None,
        "eval_reason": result.info.eval_reason,
        "error": result.error,
        "calls": result.info.calls,
        "session_id": result.info.session_id,
    }


def group_record(group: Group, threshold: float) -> dict[str, Any]:
    task = group.task
    return {
        "seq": group.seq,
        "task_id": str(getattr(task, "instance_id", task)),
        "prompt": getattr(task, "prompt", None),
        "missing": list(group.missing),
        "attempts": [attempt_record(r, threshold) for r in group.results],
    }


def fingerprint(tasks: Sequence[Any], spec: EvalSpec, harness: str) -> dict[str, Any]:
    ids = "\n".join(str(getattr(t, "instance_id", t)) for t in tasks)
    return {
        "tasks": f"{len(tasks)}:{hashlib.sha256(ids.encode()).hexdigest()[:16]}",
        "n": spec.n,
        "threshold": spec.threshold,
        "harness": harness,
    }


def run_eval(
    runtime: RolloutRuntime,
    tasks: Sequence[Any],
    spec: EvalSpec,
    out_dir: str | Path,
    *,
    label: str = "eval",
    resume: bool = True,
    on_group: Callable[[dict[str, Any]], None] | None = None,
) -> EvalReport:
    """Evaluate every task of `tasks` (resuming `out_dir`), write the report files, return it. The
    attempts run with `runtime`'s parts (harness, sandboxes, evaluator, merge, pool sizes) against
    its engine, which must be up, through a gateway of their own."""
    out = Path(out_dir)
    logbook = RolloutLog(out, fingerprint(tasks, spec, runtime.harness.name), resume=resume, setting="eval")
    todo = [s for s in range(len(tasks)) if s not in logbook.done]
    if todo:
        if logbook.done:
            log.info(
                "%s: resuming %s, %d of %d tasks already done", label, out, len(logbook.done), len(tasks)
            )
        _run_groups(runtime, tasks, spec, logbook, todo, out, label, on_group)
    report = build_report(logbook, spec, label)
    report.write(out)
    return report


def _run_groups(
    runtime: RolloutRuntime,
    tasks: Sequence[Any],
    spec: EvalSpec,
    logbook: RolloutLog,
    todo: list[int],
    out: Path,
    label: str,
    on_group,
) -> None:
    gateway = Gateway(list(runtime.engine.urls), str(out / "traces.db"), **runtime.gateway_kwargs()).start()
    sizes = runtime.sizes
    in_flight = max(2, -(-sizes.running // spec.n) + 1)  # keep the RUNNING pool full
    service = RolloutService(
        runtime.stages()(gateway),
        tasks,
        group_size=spec.n,
        sizes=sizes,
        max_groups_in_flight=in_flight,
        limit=todo[-1] + 1,
        id_prefix=label,
        **logbook.cursor(),
    ).start()
    t0, passed, valid = time.monotonic(), 0, 0
    fail_fast = FailFast(spec.n)
    try:
        for i, _ in enumerate(todo, 1):
            (group,) = service.next_groups(1, timeout=spec.group_timeout_s)
            fail_fast.see(group.results)
            record = group_record(group, spec.threshold)
            logbook.append(record)
            passed += sum(a["passed"] for a in record["attempts"])
            valid += sum(a["valid"] for a in record["attempts"])
            if on_group is not None:
                on_group(record)
            if i % 25 == 0 or i == len(todo):
                log.info(
                    "%s: %d/%d tasks, %d/%d attempts passed, %.0f s",
                    label,
                    len(logbook.done),
                    len(tasks),
                    passed,
                    valid,
                    time.monotonic() - t0,
                )
    finally:
        service.stop()
        gateway.stop()
