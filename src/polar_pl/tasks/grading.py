"""Grading with SWE-bench's own code: per-test outcomes -> status map -> report -> reward.

`swebench.harness.grading` decides what resolves an instance (FAIL_TO_PASS all pass, PASS_TO_PASS
all maintained, a skipped PASS_TO_PASS test is maintained, XFAIL passes, a missing test fails), so
our rewards mean what SWE-bench numbers mean. For pytest tasks the outcomes go through SWE-bench's
pytest log parser as a `-rA`-style log, the form its grading was written for.
"""

from __future__ import annotations

from typing import Literal

from polar_pl.tasks.results import TestOutcome

RewardMode = Literal["binary", "partial"]

# Our outcomes in SWE-bench's TestStatus vocabulary; missing / xpass have no status (= not passed).
STATUS = {
    "passed": "PASSED",
    "xfail": "XFAIL",
    "failed": "FAILED",
    "timeout": "FAILED",
    "error": "ERROR",
    "skipped": "SKIPPED",
}


def require_swebench() -> None:
    try:
        import swebench.harness.grading  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "grading patch-based tasks needs SWE-bench's package: pip install 'polar_pl[tasks]'"
        ) from exc


def status_map(tests: tuple[TestOutcome, ...], runner: str) -> dict[str, str]:
    statuses = {t.test_id: STATUS[t.outcome] for t in tests if t.outcome in STATUS}
    if runner != "pytest":
        return statuses
    from swebench.harness.log_parsers.python import parse_log_pytest

    return parse_log_pytest("\n".join(f"{s} {test_id}" for test_id, s in statuses.items()), None)


def grade(tests: tuple[TestOutcome, ...], runner: str, mode: RewardMode) -> tuple[float, bool]:
    """(reward, resolved). partial: SWE-bench's fail-to-pass rate times its pass-to-pass rate."""
    require_swebench()
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus
    from swebench.harness.grading import (
        compute_fail_to_pass,
        compute_pass_to_pass,
        get_eval_tests_report,
        get_resolution_status,
    )

    gold = {
        FAIL_TO_PASS: [t.test_id for t in tests if t.kind == "FAIL_TO_PASS"],
        PASS_TO_PASS: [t.test_id for t in tests if t.kind == "PASS_TO_PASS"],
    }
    if not gold[FAIL_TO_PASS]:
        return 0.0, False
    report = get_eval_tests_report(status_map(tests, runner), gold)
    resolved = get_resolution_status(report) == ResolvedStatus.FULL.value
    if mode == "binary":
        return float(resolved), resolved
    return compute_fail_to_pass(report) * compute_pass_to_pass(report), resolved
