"""Evaluators: turn (task, agent patch, agent answer) into a reward, in a sandbox the agent never saw.

Two-phase API so evaluation overlaps the agent run: `prewarm(task)` returns at once with a handle
while a fresh sandbox starts, receives the repository snapshot, runs setup and commits its baseline
in a background thread; `evaluate(handle, patch, answer)` waits for that, applies the patch, reverts
any test files the patch touched, applies the test patch, runs FAIL_TO_PASS and PASS_TO_PASS and
always stops the sandbox. Every failure (empty or unappliable patch, timeout, sandbox error) comes
back as an EvalResult with reward 0 and its reason; evaluate never raises.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from polar_pl.sandbox.infra import InfraError
from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.patching import apply_patch, protected_paths, restore_test_files
from polar_pl.tasks.results import EvalResult, EvalStatus, TestOutcome
from polar_pl.tasks.task import Task
from polar_pl.tasks.testrun import install_runner, run_tests
from polar_pl.tasks.workspace import new_sandbox, prepare_workspace

log = logging.getLogger(__name__)

SandboxFactory = Callable[[], Sandbox]
RewardMode = Literal["binary", "partial"]


@dataclass(slots=True)
class EvalHandle:
    """A pre-warming (or pre-warmed) evaluation sandbox for one task; use it once."""

    task: Task
    future: Future  # resolves to (sandbox, prewarm seconds); raises if preparation failed
    sandbox: Sandbox | None = None
    used: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


@runtime_checkable
class Evaluator(Protocol):
    """Scores one attempt. Called from the POSTRUN stage; `prewarm` when the agent starts."""

    def prewarm(self, task: Task) -> EvalHandle:
        """Start preparing a fresh evaluation environment for task; returns immediately."""

    def evaluate(self, handle: EvalHandle, patch: str, answer: str | None = None) -> EvalResult:
        """Score the agent's patch (workspace diff) and final answer; releases the handle."""

    def discard(self, handle: EvalHandle) -> None:
        """Release a handle that will not be evaluated (the attempt failed before POSTRUN)."""


def reward_from_tests(tests: tuple[TestOutcome, ...], mode: RewardMode) -> tuple[float, bool]:
    """(reward, resolved). Resolved: every FAIL_TO_PASS and PASS_TO_PASS test passes.

    partial: fraction of FAIL_TO_PASS passing times fraction of PASS_TO_PASS passing, so an
    untouched repository (no FAIL_TO_PASS passes) still scores 0 and breaking old tests costs.
    """
    f2p = [t.passed for t in tests if t.kind == "FAIL_TO_PASS"]
    p2p = [t.passed for t in tests if t.kind == "PASS_TO_PASS"]
    resolved = bool(f2p) and all(f2p) and all(p2p)
    if mode == "binary":
        return float(resolved), resolved
    frac_f2p = sum(f2p) / len(f2p) if f2p else 0.0
    frac_p2p = sum(p2p) / len(p2p) if p2p else 1.0
    return frac_f2p * frac_p2p, resolved


class SandboxEvaluator:
    """Runs the task's tests in a fresh sandbox from `sandbox_factory` (the configured backend)."""

    def __init__(
        self,
        sandbox_factory: SandboxFactory | None = None,
        *,
        reward: RewardMode = "binary",
        timeout_s: float = 600.0,
        per_test_timeout_s: float = 60.0,
        setup_timeout_s: float = 600.0,
        max_prewarm: int = 8,
    ) -> None:
        if reward not in ("binary", "partial"):
            raise ValueError(f"evaluator.reward is {reward!r}; allowed: binary, partial")
        if sandbox_factory is None:
            from polar_pl.sandbox.local import LocalSandbox  # default backend, imported lazily

            sandbox_factory = LocalSandbox
        self.sandbox_factory = sandbox_factory
        self.reward = reward
        self.timeout_s = timeout_s
        self.per_test_timeout_s = per_test_timeout_s
        self.setup_timeout_s = setup_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max_prewarm, thread_name_prefix="polar-prewarm")

    # -- lifecycle -------------------------------------------------------------------------------
    def prewarm(self, task: Task) -> EvalHandle:
        return EvalHandle(task, self._pool.submit(self._prepare, task))

    def _prepare(self, task: Task) -> tuple[Sandbox, float]:
        t0 = time.monotonic()
        sandbox = new_sandbox(self.sandbox_factory, task)
        try:
            sandbox.start()
            prepare_workspace(task, sandbox, setup_timeout=self.setup_timeout_s)
        except BaseException:
            _stop_quietly(sandbox)
            raise
        return sandbox, time.monotonic() - t0

    def discard(self, handle: EvalHandle) -> None:
        with handle.lock:
            handle.used = True
        handle.future.add_done_callback(lambda f: None if f.exception() else _stop_quietly(f.result()[0]))

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- scoring ---------------------------------------------------------------------------------
    def evaluate(self, handle: EvalHandle, patch: str, answer: str | None = None) -> EvalResult:
        return self._score(handle, patch, allow_empty=False)

    def evaluate_task(self, task: Task, patch: str, answer: str | None = None) -> EvalResult:
        """prewarm + evaluate in one call (when there is nothing to overlap with)."""
        return self.evaluate(self.prewarm(task), patch, answer)

    def run_unpatched(self, task: Task) -> EvalResult:
        """Run the tests on the repository with only the test patch (the suite's self-check)."""
        return self._score(self.prewarm(task), "", allow_empty=True)

    def _score(self, handle: EvalHandle, patch: str, *, allow_empty: bool) -> EvalResult:
        task, t0 = handle.task, time.monotonic()
        with handle.lock:
            if handle.used:
                return _fail(task, "error", "evaluation handle already used", t0)
            handle.used = True
        if not patch.strip() and not allow_empty:
            self.discard(handle)
            return _fail(task, "empty_patch", "the agent produced no changes", t0)
        try:
            sandbox, prewarm_s = handle.future.result(timeout=self.setup_timeout_s + self.timeout_s)
        except FutureTimeout:
            self.discard(handle)
            return _fail(task, "timeout", "evaluation sandbox was not ready in time", t0)
        except InfraError as exc:
            return _infra(task, f"preparing the evaluation sandbox failed: {exc}", exc, t0)
        except Exception as exc:  # noqa: BLE001  (any preparation failure is recorded, never raised)
            return _fail(task, "error", f"preparing the evaluation sandbox failed: {exc}", t0)
        try:
            return self._score_in(sandbox, task, patch, prewarm_s, t0)
        except InfraError as exc:
            return _infra(task, f"evaluation failed: {exc}", exc, t0, prewarm_s)
        except Exception as exc:  # noqa: BLE001  (a broken backend must not take the trainer down)
            return _fail(task, "error", f"evaluation failed: {type(exc).__name__}: {exc}", t0)
        finally:
            _stop_quietly(sandbox)

    def _score_in(self, sandbox: Sandbox, task: Task, patch: str, prewarm_s: float, t0: float) -> EvalResult:
        method = ""
        if patch.strip():
            applied = apply_patch(sandbox, patch, name="agent")
            if not applied.ok:
                return _fail(task, "patch_failed", f"patch does not apply:\n{applied.error}", t0, prewarm_s)
            method = applied.method
        sandbox.exec("rm -rf .polar_eval", timeout=60)  # nothing the patch put there survives
        restored = restore_test_files(sandbox, protected_paths(task.test_patch, task.test_ids))
        if task.test_patch.strip():
            tp = apply_patch(sandbox, task.test_patch, name="test")
            if not tp.ok or tp.method != "git apply":  # a task bug: its test patch must apply cleanly
                why = f"applies only with {tp.method}" if tp.ok else f"does not apply:\n{tp.error}"
                return _fail(task, "error", f"the task's test patch {why}", t0, prewarm_s)
        install_runner(sandbox)
        remaining = max(1.0, self.timeout_s - (time.monotonic() - t0))
        run = run_tests(sandbox, task, timeout=remaining, per_test_timeout=self.per_test_timeout_s)
        reward, resolved = reward_from_tests(run.outcomes, self.reward)
        if run.timed_out:
            status, reason, reward = "timeout", f"tests exceeded {remaining:.0f}s", 0.0
        else:
            status = "resolved" if resolved else "unresolved"
            failing = [t.test_id for t in run.outcomes if not t.passed]
            reason = "all tests pass" if resolved else f"{len(failing)} failing: {', '.join(failing[:5])}"
        return EvalResult(
            task.instance_id, reward, status, reason, run.outcomes, method, restored,
            prewarm_s, time.monotonic() - t0, run.log,
        )  # fmt: skip


def _fail(task: Task, status: EvalStatus, reason: str, t0: float, prewarm_s: float = 0.0) -> EvalResult:
    return EvalResult(
        task.instance_id, 0.0, status, reason, prewarm_s=prewarm_s, duration_s=time.monotonic() - t0
    )


def _infra(task: Task, reason: str, exc: InfraError, t0: float, prewarm_s: float = 0.0) -> EvalResult:
    return EvalResult(task.instance_id, 0.0, "infra_failure", reason, prewarm_s=prewarm_s,
                      duration_s=time.monotonic() - t0, infra_kind=exc.kind)  # fmt: skip


def _stop_quietly(sandbox: Sandbox) -> None:
    try:
        sandbox.stop()
    except Exception:  # cleanup must not mask the result; backends sweep leftovers by label
        log.warning("stopping an evaluation sandbox failed", exc_info=True)
