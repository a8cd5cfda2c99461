"""Running a task's tests in the evaluation sandbox so that the code under test cannot decide them.

The host puts the task's own test files (from `trusted.py`, never the agent's) and the in-sandbox
kit (`inside/`: supervisor, runner, guard, pytest plugin, and for images without pytest the pytest
bundle) into the sandbox, then runs the supervisor once with a fresh key in its environment. The
supervisor runs one fresh child process per test file and answers with one MACed line; the host
accepts outcomes only from that line (key and nonce checked), never from what the tests print.
The pytest log printed by the children is still read, with SWE-bench's parser, to catch forged
`PASSED` lines. Outcomes: passed, xfail, failed, error, skipped, missing, timeout, xpass.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import posixpath
import secrets
import shlex
from dataclasses import dataclass
from functools import cache
from importlib import resources

from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.results import Outcome, TestKind, TestOutcome
from polar_pl.tasks.task import Task

KIT_DIR = ".polar_eval"
CONFIG_DIR = f"{KIT_DIR}/cfg"
_SOURCES = {"polar_guard": "guard.py", "polar_runner": "runner.py", "polar_pytest_plugin": "pytest_plugin.py"}
_PYTEST_ARGS = ("-p", "no:cacheprovider", "-o", "enable_assertion_pass_hook=true", "-rA", "-q")
STARTUP_S = 60.0  # per child: interpreter, pytest import and collection


@dataclass(frozen=True, slots=True)
class TestRun:
    outcomes: tuple[TestOutcome, ...]
    timed_out: bool
    log: str
    tampering: tuple[str, ...] = ()
    error: str = ""  # the supervisor gave no valid report (reward 0, status error)


@cache
def _kit_file(name: str) -> bytes:
    return resources.files("polar_pl.tasks.inside").joinpath(name).read_bytes()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def group_by_file(task: Task, trusted: dict[str, bytes]) -> list[list[str]]:
    """Test ids grouped by the file that holds them, in the task's order (one child each)."""
    groups: dict[str, list[str]] = {}
    for test_id in task.test_ids:
        groups.setdefault(_test_file(test_id, trusted), []).append(test_id)
    return list(groups.values())


def _test_file(test_id: str, trusted: dict[str, bytes]) -> str:
    if "::" in test_id or test_id.endswith(".py"):
        return test_id.split("::", 1)[0]
    parts = test_id.split(".")
    for k in range(len(parts), 0, -1):
        stem = "/".join(parts[:k])
        if f"{stem}.py" in trusted:
            return f"{stem}.py"
    return "/".join(parts[:-2] or parts[:1])


def pytest_command(task: Task) -> tuple[str, list[str]]:
    """(python, extra pytest args) from the task's test command: `[python -m] pytest ARGS`."""
    if not task.test_command:
        return "python3", []
    argv = shlex.split(task.test_command)
    if len(argv) >= 3 and argv[1:3] == ["-m", "pytest"]:
        return argv[0], argv[3:]
    if argv and posixpath.basename(argv[0]) in ("pytest", "py.test"):
        return "python3", argv[1:]
    raise ValueError(
        f"task {task.instance_id!r}: test_command {task.test_command!r} must be `pytest ARGS` or "
        "`PYTHON -m pytest ARGS` (the evaluator runs pytest itself, one process per test file)"
    )


def _spec(task: Task, sandbox: Sandbox, trusted: dict[str, bytes], timeout_s: float, nonce: str) -> dict:
    spec = {
        "nonce": nonce,
        "workspace": sandbox.workdir,
        "mode": task.test_runner,
        "files": group_by_file(task, trusted),
        "timeout_s": timeout_s,
        "startup_s": STARTUP_S,
        "trusted": {rel: _sha(data) for rel, data in trusted.items()},
        "sources": {name: (f, _sha(_kit_file(f))) for name, f in _SOURCES.items()},
        # Plugins come only from `-p NAME` in the task's test command: faster, and the same run
        # whatever else the image has installed.
        "env": {
            "HOME": sandbox.home,
            "LANG": "C.UTF-8",
            "PY_COLORS": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        },
    }
    if task.test_runner == "pytest":
        from polar_pl.tasks.pytest_bundle import bundle

        extra = pytest_command(task)[1]
        config = next(p for p in trusted if p.startswith(f"{CONFIG_DIR}/"))
        spec["pytest_args"] = [*_PYTEST_ARGS, "--rootdir", sandbox.workdir, "-c", config, *extra]
        spec["bundle"] = ("pytest-bundle.zip", _sha(bundle()))
    return spec


def install_kit(
    sandbox: Sandbox, task: Task, trusted: dict[str, bytes], timeout_s: float, nonce: str
) -> None:
    """Write the kit and the spec into the sandbox (after the agent's patch and the test files)."""
    for f in _SOURCES.values():
        sandbox.put_file(f"{KIT_DIR}/{f}", _kit_file(f))
    sandbox.put_file(f"{KIT_DIR}/supervisor.py", _kit_file("supervisor.py"))
    spec = _spec(task, sandbox, trusted, timeout_s, nonce)
    if "bundle" in spec:
        from polar_pl.tasks.pytest_bundle import bundle

        sandbox.put_file(f"{KIT_DIR}/pytest-bundle.zip", bundle())
    sandbox.put_file(f"{KIT_DIR}/spec.json", json.dumps(spec).encode())


def run_tests(
    sandbox: Sandbox, task: Task, trusted: dict[str, bytes], *, timeout: float, per_test_timeout: float = 60.0
) -> TestRun:
    """Run the task's tests through the supervisor; every requested id gets an outcome."""
    key, nonce = secrets.token_bytes(32), secrets.token_hex(16)
    install_kit(sandbox, task, trusted, per_test_timeout, nonce)
    spec_sha = _sha(sandbox.get_file(f"{KIT_DIR}/spec.json"))
    python = pytest_command(task)[0] if task.test_runner == "pytest" else "python3"
    res = sandbox.exec(
        [python, "-I", "-B", f"{KIT_DIR}/supervisor.py", f"{KIT_DIR}/spec.json"],
        env={"POLAR_EVAL_KEY": key.hex()},
        timeout=timeout,
    )
    log = res.stderr[-8000:]
    report, problem = read_report(res.stdout, key, nonce, spec_sha)
    if report is None:
        if res.timed_out:
            return TestRun(_outcomes(task, {}, {}, timed_out=True), True, log)
        if problem.startswith("tampering"):
            return TestRun(_outcomes(task, {}, {}), False, log, (problem.removeprefix("tampering: "),))
        if res.exit_code < 0 or res.exit_code > 128:
            why = f"the evaluation supervisor was killed (exit {res.exit_code}) before reporting"
            return TestRun(_outcomes(task, {}, {}), False, log, (why,))
        return TestRun(
            _outcomes(task, {}, {}), False, log, error=f"{problem} (exit {res.exit_code}): {log[-600:]}"
        )
    outcomes = _outcomes(task, report["results"], report["fatal"])
    tampering = list(report["tampering"])
    if task.test_runner == "pytest":
        tampering += forged_log_lines(report["log"], outcomes)
    return TestRun(outcomes, False, (report["log"][-8000:] + log)[-8000:], tuple(tampering))


def read_report(stdout: str, key: bytes, nonce: str, spec_sha: str) -> tuple[dict | None, str]:
    """The supervisor's report if exactly one authentic one is there; else (None, why)."""
    lines = [line for line in stdout.splitlines() if line.startswith("POLAR-REPORT ")]
    if not lines:
        return None, "the evaluation supervisor gave no report"
    if len(lines) > 1:
        return None, "tampering: more than one evaluation report on the supervisor's output"
    try:
        _, b64, mac = lines[0].split(" ")
        payload = base64.b64decode(b64, validate=True)
    except ValueError:
        return None, "tampering: a malformed evaluation report"
    if not hmac.compare_digest(hmac.new(key, payload, hashlib.sha256).hexdigest(), mac):
        return None, "tampering: an evaluation report not signed with this evaluation's key"
    report = json.loads(payload)
    if report.get("nonce") != nonce or report.get("spec_sha") != spec_sha:
        return None, "tampering: an evaluation report from another run"
    return report, ""


def _outcomes(task: Task, results: dict, fatal: dict, *, timed_out: bool = False) -> tuple[TestOutcome, ...]:
    out = []
    groups: tuple[tuple[TestKind, tuple[str, ...]], ...] = (
        ("FAIL_TO_PASS", task.fail_to_pass),
        ("PASS_TO_PASS", task.pass_to_pass),
    )
    for kind, ids in groups:
        for test_id in ids:
            got = results.get(test_id)
            if got is None:
                outcome: Outcome = "timeout" if timed_out else "error" if test_id in fatal else "missing"
                out.append(TestOutcome(test_id, kind, outcome, fatal.get(test_id, "no result reported")))
            else:
                out.append(TestOutcome(test_id, kind, got["outcome"], got.get("detail", "")))
    return tuple(out)


def forged_log_lines(log: str, outcomes: tuple[TestOutcome, ...]) -> list[str]:
    """Tests the printed pytest summary (read with SWE-bench's parser) calls passing although the
    runner recorded otherwise: someone printed forged result lines."""
    from swebench.harness.log_parsers.python import parse_log_pytest

    claimed = parse_log_pytest(log, None)
    forged = [t.test_id for t in outcomes if claimed.get(t.test_id) in ("PASSED", "XFAIL") and not t.passed]
    return [f"the test output claims {', '.join(forged[:3])} passed"] if forged else []
