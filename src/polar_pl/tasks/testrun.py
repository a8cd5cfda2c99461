"""Running a task's FAIL_TO_PASS and PASS_TO_PASS tests in a sandbox and reading per-test outcomes.

`unittest` tasks (the built-in suite; images with only python3 + git) use our stdlib runner, which
writes one outcome per id to a JSON file. `pytest` tasks (SWE-bench instances) run
`python -m pytest -rA` and are read from the short summary, the way SWE-bench's log parsers do.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass
from importlib import resources

from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.results import TestOutcome
from polar_pl.tasks.task import Task

RUNNER_PATH = ".polar_eval/unittest_runner.py"
PYTEST_COMMAND = "python3 -m pytest -rA -p no:cacheprovider --no-header -q"
_PYTEST_LINE = re.compile(
    r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)(?:\s+-\s+(.*))?$", re.MULTILINE
)
_PYTEST_MAP = {
    "PASSED": "passed",
    "XFAIL": "passed",
    "FAILED": "failed",
    "XPASS": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
}


@dataclass(frozen=True, slots=True)
class TestRun:
    outcomes: tuple[TestOutcome, ...]
    timed_out: bool
    log: str


def runner_source() -> bytes:
    return resources.files("polar_pl.tasks").joinpath("unittest_runner.py").read_bytes()


def install_runner(sandbox: Sandbox) -> None:
    """Put the stdlib runner into the sandbox (done while pre-warming)."""
    sandbox.put_file(RUNNER_PATH, runner_source())


def run_tests(sandbox: Sandbox, task: Task, *, timeout: float, per_test_timeout: float = 60.0) -> TestRun:
    """Run the task's tests; every requested id gets an outcome ("missing" if never reported)."""
    if task.test_runner == "pytest":
        raw, timed_out, log = _run_pytest(sandbox, task, timeout)
    else:
        raw, timed_out, log = _run_unittest(sandbox, task, timeout, per_test_timeout)
    outcomes = []
    for kind, ids in (("FAIL_TO_PASS", task.fail_to_pass), ("PASS_TO_PASS", task.pass_to_pass)):
        for test_id in ids:
            got = raw.get(test_id)
            if got is None:
                outcome = "timeout" if timed_out else "missing"
                outcomes.append(TestOutcome(test_id, kind, outcome, "no result reported"))
            else:
                outcomes.append(TestOutcome(test_id, kind, got["outcome"], got.get("detail", "")))
    return TestRun(tuple(outcomes), timed_out, log)


def _run_unittest(
    sandbox: Sandbox, task: Task, timeout: float, per_test_timeout: float
) -> tuple[dict, bool, str]:
    nonce = secrets.token_hex(8)
    ids_path, out_path = f".polar_eval/ids-{nonce}.json", f".polar_eval/out-{nonce}.json"
    sandbox.put_file(ids_path, json.dumps(list(task.test_ids)).encode())
    res = sandbox.exec(
        f"python3 -I {RUNNER_PATH} {ids_path} {out_path} {per_test_timeout:g}", timeout=timeout
    )
    log = (res.stdout + res.stderr)[-8000:]
    try:
        raw = json.loads(sandbox.get_file(out_path))
    except (OSError, ValueError, KeyError) as exc:  # no file: the runner died before the first test
        log += f"\n[polar] no results file: {exc!r}"
        raw = {}
    return raw, res.timed_out, log


def _run_pytest(sandbox: Sandbox, task: Task, timeout: float) -> tuple[dict, bool, str]:
    ids = " ".join(shlex.quote(t) for t in task.test_ids)
    res = sandbox.exec(f"{task.test_command or PYTEST_COMMAND} {ids}", timeout=timeout)
    log = res.stdout + res.stderr
    return parse_pytest_summary(log), res.timed_out, log[-8000:]


def parse_pytest_summary(log: str) -> dict[str, dict[str, str]]:
    """Map test id -> outcome from the `-rA` short test summary lines."""
    out: dict[str, dict[str, str]] = {}
    for status, test_id, detail in _PYTEST_LINE.findall(log):
        out[test_id] = {"outcome": _PYTEST_MAP[status], "detail": detail or ""}
    return out
