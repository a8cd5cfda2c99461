"""The suite's self-check: every reference patch resolves its task, and the unpatched repository
fails every FAIL_TO_PASS test while passing PASS_TO_PASS (so the tests really show the bug)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from polar_pl.tasks.evaluator import SandboxEvaluator
from polar_pl.tasks.results import EvalResult
from polar_pl.tasks.task import Task


@dataclass(frozen=True, slots=True)
class TaskCheck:
    task: Task
    reference: EvalResult  # the gold patch, evaluated like an agent's
    unpatched: EvalResult  # only the test patch applied
    seconds: float

    @property
    def reference_ok(self) -> bool:
        return self.reference.resolved and self.reference.reward == 1.0

    @property
    def unpatched_ok(self) -> bool:
        """No FAIL_TO_PASS test passes and every PASS_TO_PASS test does, without the fix."""
        if self.unpatched.status not in ("resolved", "unresolved"):
            return False
        f2p = [t for t in self.unpatched.tests if t.kind == "FAIL_TO_PASS"]
        p2p = [t for t in self.unpatched.tests if t.kind == "PASS_TO_PASS"]
        return bool(f2p) and not any(t.passed for t in f2p) and all(t.passed for t in p2p)

    @property
    def ok(self) -> bool:
        return self.reference_ok and self.unpatched_ok

    def problem(self) -> str:
        if not self.reference_ok:
            return f"reference patch: {self.reference.status}: {self.reference.reason[:300]}"
        if not self.unpatched_ok:
            return f"unpatched repository: {self.unpatched.status}: {self.unpatched.reason[:300]}"
        return ""


def check_task(task: Task, evaluator: SandboxEvaluator) -> TaskCheck:
    t0 = time.monotonic()
    if not task.patch.strip():
        raise ValueError(f"task {task.instance_id!r} has no reference patch to check")
    reference_handle = evaluator.prewarm(task)  # both sandboxes warm up at once
    unpatched = evaluator.run_unpatched(task)
    reference = evaluator.evaluate(reference_handle, task.patch)
    return TaskCheck(task, reference, unpatched, time.monotonic() - t0)


def check_suite(tasks: list[Task], evaluator: SandboxEvaluator, workers: int = 2) -> list[TaskCheck]:
    """Check every task (in parallel); results in the order of `tasks`."""
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="polar-check") as pool:
        return list(pool.map(lambda t: check_task(t, evaluator), tasks))


@dataclass(frozen=True, slots=True)
class HarborCheck:
    """A Harbor task's self-check: its solution/solve.sh passes, the empty attempt does not."""

    task: Task
    reference: EvalResult  # the oracle's workspace diff, verified like an agent's
    unpatched: EvalResult  # the empty attempt
    seconds: float

    @property
    def ok(self) -> bool:
        return self.reference.resolved and not self.unpatched.resolved

    def problem(self) -> str:
        if not self.reference.resolved:
            return f"solution: {self.reference.status}: {self.reference.reason[:300]}"
        if self.unpatched.resolved:
            return f"the empty attempt passes: {self.unpatched.reason[:300]}"
        return ""


def check_harbor_task(task, verifier) -> HarborCheck:
    t0 = time.monotonic()
    try:
        patch = verifier.run_oracle(task)
    except (RuntimeError, ValueError) as exc:
        failed = EvalResult(task.instance_id, 0.0, "error", f"solution/solve.sh: {exc}")
        return HarborCheck(task, failed, verifier.evaluate_attempt(task, ""), time.monotonic() - t0)
    reference = verifier.evaluate_attempt(task, patch)
    return HarborCheck(task, reference, verifier.evaluate_attempt(task, ""), time.monotonic() - t0)


def check_harbor(tasks: list[Task], verifier, workers: int = 2) -> list[HarborCheck]:
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="polar-check") as pool:
        return list(pool.map(lambda t: check_harbor_task(t, verifier), tasks))
