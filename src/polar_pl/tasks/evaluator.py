"""Evaluators: turn (task, agent patch, agent answer) into a reward, in a sandbox the agent never saw.

Two-phase API so evaluation overlaps the agent run: `prewarm(task)` returns at once with a handle
while a fresh sandbox starts, receives the repository snapshot, runs setup and commits its baseline
in a background thread (and the task's own test files are built on the host, `trusted.py`);
`evaluate(handle, patch, answer)` waits for that, applies the patch, reverts any test files the patch
touched, writes the task's test files (test patch included) over them, runs FAIL_TO_PASS and
PASS_TO_PASS through the supervisor (`testrun.py`, `inside/`), grades with SWE-bench's code
(`grading.py`) and always stops the sandbox. What the guard catches is status "tampering", reward 0.
Every failure (empty or unappliable patch, timeout, sandbox error) comes back as an EvalResult with
reward 0 and its reason; evaluate never raises.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from polar_pl.sandbox.infra import InfraError
from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.grading import RewardMode, grade, require_swebench
from polar_pl.tasks.patching import apply_patch, forbidden_paths, protected_paths, restore_test_files
from polar_pl.tasks.results import EvalResult, EvalStatus
from polar_pl.tasks.task import Task
from polar_pl.tasks.testrun import KIT_DIR, run_tests
from polar_pl.tasks.trusted import trusted_files
from polar_pl.tasks.workspace import new_sandbox, prepare_workspace

log = logging.getLogger(__name__)

SandboxFactory = Callable[[], Sandbox]
# Compiled files and caches the patch may have planted next to the sources or the tests.
_CLEAN_CACHES = (
    "find . -path ./.git -prune -o \\( -name __pycache__ -o -name '*.pyc' \\) -prune -exec rm -rf {} +"
)


@dataclass(slots=True)
class EvalHandle:
    """A pre-warming (or pre-warmed) evaluation sandbox for one task; use it once."""

    task: Task
    future: Future  # resolves to (sandbox, prewarm seconds, trusted files); raises if preparation failed
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
        require_swebench()  # at construction, not at the first reward
        if sandbox_factory is None:
            from polar_pl.sandbox.local import LocalSandbox  # default backend, imported lazily

            sandbox_factory = LocalSandbox
        self.sandbox_factory = sandbox_factory
        self.reward = reward
        self.timeout_s = timeout_s
        self.per_test_timeout_s = per_test_timeout_s
        self.setup_timeout_s = setup_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max_prewarm, thread_name_prefix="polar-prewarm")
        self._trusted: dict[tuple[str, str, str], dict[str, bytes]] = {}
        self._trusted_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------------
    def prewarm(self, task: Task) -> EvalHandle:
        return EvalHandle(task, self._pool.submit(self._prepare, task))

    def _prepare(self, task: Task) -> tuple[Sandbox, float, dict[str, bytes]]:
        t0 = time.monotonic()
        trusted = self._trusted_files(task)
        sandbox = new_sandbox(self.sandbox_factory, task)
        try:
            sandbox.start()
            prepare_workspace(task, sandbox, setup_timeout=self.setup_timeout_s)
        except BaseException:
            _stop_quietly(sandbox)
            raise
        return sandbox, time.monotonic() - t0, trusted

    def _trusted_files(self, task: Task) -> dict[str, bytes]:
        key = (task.instance_id, task.base_commit, task.test_runner)
        with self._trusted_lock:
            if key not in self._trusted:
                self._trusted[key] = trusted_files(task)
            return self._trusted[key]

    def discard(self, handle: EvalHandle) -> None:
        """The handle's sandbox is gone when this returns: a preparation not started is cancelled,
        one under way is waited for and its sandbox stopped."""
        with handle.lock:
            handle.used = True
        if handle.future.cancel():
            return
        try:
            sandbox = handle.future.result()[0]
        except BaseException:  # a failed preparation stopped its own sandbox
            return
        _stop_quietly(sandbox)

    def _discard_when_ready(self, handle: EvalHandle) -> None:
        """A preparation past its deadline: its sandbox is stopped whenever it comes (close() waits)."""
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
            sandbox, prewarm_s, trusted = handle.future.result(timeout=self.setup_timeout_s + self.timeout_s)
        except FutureTimeout:
            self._discard_when_ready(handle)
            return _fail(task, "timeout", "evaluation sandbox was not ready in time", t0)
        except InfraError as exc:
            return _infra(task, f"preparing the evaluation sandbox failed: {exc}", exc, t0)
        except Exception as exc:
            return _fail(task, "error", f"preparing the evaluation sandbox failed: {exc}", t0)
        try:
            return self._score_in(sandbox, task, patch, trusted, prewarm_s, t0)
        except InfraError as exc:
            return _infra(task, f"evaluation failed: {exc}", exc, t0, prewarm_s)
        except Exception as exc:
            return _fail(task, "error", f"evaluation failed: {type(exc).__name__}: {exc}", t0)
        finally:
            _stop_quietly(sandbox)

    def _score_in(
        self, sandbox: Sandbox, task: Task, patch: str, trusted: dict[str, bytes], prewarm_s: float, t0: float
    ) -> EvalResult:
        method = ""
        if patch.strip():
            if bad := forbidden_paths(patch):
                why = f"the patch writes into {', '.join(bad[:3])}"
                return _fail(task, "tampering", f"tampering: {why}", t0, prewarm_s, tampering=(why,))
            applied = apply_patch(sandbox, patch, name="agent")
            if not applied.ok:
                return _fail(task, "patch_failed", f"patch does not apply:\n{applied.error}", t0, prewarm_s)
            method = applied.method
        sandbox.exec(f"rm -rf {KIT_DIR}", timeout=60)  # nothing the patch put there survives
        restored = restore_test_files(sandbox, protected_paths(task.test_patch, task.test_ids))
        for rel, data in trusted.items():  # the task's own test files (test patch applied)
            sandbox.put_file(rel, data)
        sandbox.exec(_CLEAN_CACHES, timeout=60)
        remaining = max(1.0, self.timeout_s - (time.monotonic() - t0))
        run = run_tests(sandbox, task, trusted, timeout=remaining, per_test_timeout=self.per_test_timeout_s)
        reward, resolved = grade(run.outcomes, task.test_runner, self.reward)
        failing = [t.test_id for t in run.outcomes if not t.passed]
        status: EvalStatus
        if run.tampering:
            status, reward, reason = "tampering", 0.0, "tampering: " + "; ".join(run.tampering)
        elif run.error:
            status, reward, reason = "error", 0.0, run.error
        elif run.timed_out:
            status, reward, reason = "timeout", 0.0, f"tests exceeded {remaining:.0f}s"
        else:
            status = "resolved" if resolved else "unresolved"
            reason = "all tests pass" if resolved else f"{len(failing)} failing: {', '.join(failing[:5])}"
        return EvalResult(
            task.instance_id,
            reward,
            status,
            reason,
            run.outcomes,
            method,
            restored,
            prewarm_s,
            time.monotonic() - t0,
            run.log,
            tampering=run.tampering,
        )


def _fail(
    task: Task, status: EvalStatus, reason: str, t0: float, prewarm_s: float = 0.0, tampering: tuple = ()
) -> EvalResult:
    return EvalResult(
        task.instance_id,
        0.0,
        status,
        reason,
        prewarm_s=prewarm_s,
        duration_s=time.monotonic() - t0,
        tampering=tampering,
    )


def _infra(task: Task, reason: str, exc: InfraError, t0: float, prewarm_s: float = 0.0) -> EvalResult:
    return EvalResult(
        task.instance_id,
        0.0,
        "infra_failure",
        reason,
        prewarm_s=prewarm_s,
        duration_s=time.monotonic() - t0,
        infra_kind=exc.kind,
    )


def _stop_quietly(sandbox: Sandbox) -> None:
    try:
        sandbox.stop()
    except Exception:  # cleanup must not mask the result; backends sweep leftovers by label
        log.warning("stopping an evaluation sandbox failed", exc_info=True)
