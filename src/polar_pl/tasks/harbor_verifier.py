"""The Harbor verifier: a task's tests/test.sh in a fresh container from the task's image.

Two phases like every evaluator: `prewarm` starts the container while the agent runs (it starts
from the image, the agent never touched it); `evaluate` applies the agent's workspace diff, uploads
tests/ to /tests (only now: nothing the agent ran could read or change them), empties
/logs/verifier, runs `bash /tests/test.sh` in the WORKDIR with `[verifier].env`, and reads the
reward as Harbor defines it: /logs/verifier/reward.txt (one number) first, then reward.json (a
number, or an object with "reward", or with exactly one numeric value); without either, exit status
0 scores 1.0 and anything else 0.0. `run_oracle` runs solution/solve.sh the same way an agent would
work and returns its diff (the reference patch of `polar-pl tasks check`).
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from polar_pl.sandbox.infra import InfraError
from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.evaluator import SandboxEvaluator, _fail, _stop_quietly
from polar_pl.tasks.harbor import HarborTask
from polar_pl.tasks.patching import apply_patch
from polar_pl.tasks.results import EvalResult, EvalStatus
from polar_pl.tasks.task import Task
from polar_pl.tasks.workspace import new_sandbox

REWARD_TXT, REWARD_JSON = "/logs/verifier/reward.txt", "/logs/verifier/reward.json"


class RewardFormatError(ValueError):
    """A reward file is present but holds no number."""


def parse_reward(txt: bytes | None, js: bytes | None) -> float | None:
    """The reward from Harbor's files (reward.txt before reward.json); None when neither exists."""
    if txt is not None and txt.strip():
        try:
            return float(txt.decode().strip())
        except ValueError as exc:
            raise RewardFormatError(f"reward.txt holds {txt[:80]!r}, not a number") from exc
    if js is not None and js.strip():
        try:
            data = json.loads(js)
        except json.JSONDecodeError as exc:
            raise RewardFormatError(f"reward.json is not JSON ({exc})") from exc
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
        if isinstance(data, dict):
            if isinstance(data.get("reward"), int | float):
                return float(data["reward"])
            numbers = [v for v in data.values() if isinstance(v, int | float) and not isinstance(v, bool)]
            if len(numbers) == 1:
                return float(numbers[0])
        raise RewardFormatError(f"reward.json has no single numeric reward: {js[:120]!r}")
    return None


class HarborVerifier(SandboxEvaluator):
    """`Evaluator` for HarborTask. reward threshold: an attempt counts as resolved at >= 1.0."""

    def _prepare(self, task: Task) -> tuple[Sandbox, float, dict[str, bytes]]:
        t0 = time.monotonic()
        sandbox = new_sandbox(self.sandbox_factory, task)
        try:
            sandbox.start()  # takes the diff baseline of the image's WORKDIR
        except BaseException:
            _stop_quietly(sandbox)
            raise
        return sandbox, time.monotonic() - t0, {}  # no trusted test files: tests/ is uploaded

    def _score_in(
        self, sandbox: Sandbox, task: Task, patch: str, trusted: dict[str, bytes], prewarm_s: float, t0: float
    ) -> EvalResult:
        assert isinstance(task, HarborTask)  # sources.py pairs this verifier with Harbor tasks only
        method = ""
        if patch.strip():
            applied = apply_patch(sandbox, patch, name="agent")
            if not applied.ok:
                return _fail(task, "patch_failed", f"patch does not apply:\n{applied.error}", t0, prewarm_s)
            method = applied.method
        sandbox.exec("rm -rf .polar_eval", timeout=60)  # the patch file; the tests see the agent's work only
        upload(sandbox, Path(task.tests_dir), "/tests")
        sandbox.exec(["sh", "-c", "rm -rf /logs/verifier/* /logs/verifier/.[!.]*"], timeout=60)
        timeout = min(task.verifier_timeout_s, self.timeout_s)
        run = sandbox.exec(["bash", "/tests/test.sh"], env=dict(task.verifier_env), timeout=timeout)
        log = (run.stdout + run.stderr)[-8000:]
        if run.timed_out:
            return _fail(task, "timeout", f"tests/test.sh exceeded {timeout:.0f}s", t0, prewarm_s)
        try:
            reward = parse_reward(_read(sandbox, REWARD_TXT), _read(sandbox, REWARD_JSON))
        except RewardFormatError as exc:
            return _fail(task, "error", f"verifier output: {exc}", t0, prewarm_s)
        source = "reward file"
        if reward is None:
            reward, source = (1.0 if run.exit_code == 0 else 0.0), f"exit status {run.exit_code}"
        status: EvalStatus = "resolved" if reward >= 1.0 else "unresolved"
        return EvalResult(
            task.instance_id,
            reward,
            status,
            f"reward {reward:g} from {source}",
            patch_method=method,
            prewarm_s=prewarm_s,
            duration_s=time.monotonic() - t0,
            log=log,
        )

    def run_oracle(self, task: HarborTask) -> str:
        """Run solution/solve.sh in a fresh container from the task's image; returns its diff."""
        if task.solution_dir is None:
            raise ValueError(f"task {task.instance_id!r} has no solution/solve.sh")
        sandbox = new_sandbox(self.sandbox_factory, task)
        try:
            sandbox.start()
            upload(sandbox, Path(task.solution_dir), "/solution")
            res = sandbox.exec(
                ["bash", "/solution/solve.sh"],
                env=dict(task.solution_env),
                timeout=task.agent_timeout_s or self.timeout_s,
            )
            if res.exit_code != 0:
                raise RuntimeError(
                    f"solution/solve.sh exited {res.exit_code}: {(res.stderr or res.stdout)[-800:]}"
                )
            return sandbox.diff()
        finally:
            _stop_quietly(sandbox)

    def evaluate_attempt(self, task: HarborTask, patch: str) -> EvalResult:
        """Score `patch` (empty allowed: the empty attempt of the self-check)."""
        return self._score(self.prewarm(task), patch, allow_empty=True)


def upload(sandbox: Sandbox, src: Path, dest: str) -> None:
    """Copy a host folder to `dest` in the sandbox, replacing what was there."""
    sandbox.exec(["sh", "-c", f"rm -rf {shlex.quote(dest)}/* {shlex.quote(dest)}/.[!.]*"], timeout=60)
    with tempfile.TemporaryDirectory(prefix="polar-harbor-") as tmp:
        copy = Path(tmp) / "x"
        shutil.copytree(src, copy)
        sandbox.put_archive(copy, dest)


def _read(sandbox: Sandbox, path: str) -> bytes | None:
    try:
        return sandbox.get_file(path)
    except (FileNotFoundError, IsADirectoryError):
        return None
    except InfraError:
        raise
    except (OSError, RuntimeError):
        return None
