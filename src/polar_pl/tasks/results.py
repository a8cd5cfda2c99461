"""Evaluation results: the reward with its reason and the outcome of every test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# resolved / unresolved: the tests ran. tampering: the attempt reached for the evaluation itself
# (reward 0, trained on). The others say why the tests did not run (reward 0; "error" is masked).
# infra_failure: the evaluation sandbox could not be had or used (see polar_pl.sandbox.infra); masked.
EvalStatus = Literal[
    "resolved",
    "unresolved",
    "tampering",
    "empty_patch",
    "no_answer",
    "patch_failed",
    "timeout",
    "error",
    "infra_failure",
]
TestKind = Literal["FAIL_TO_PASS", "PASS_TO_PASS"]
Outcome = Literal["passed", "xfail", "failed", "xpass", "error", "skipped", "missing", "timeout"]


@dataclass(frozen=True, slots=True)
class TestOutcome:
    test_id: str
    kind: TestKind
    outcome: Outcome
    detail: str = ""  # the failure message / traceback tail, empty on success

    @property
    def passed(self) -> bool:
        return self.outcome in ("passed", "xfail")  # an expected failure passes, as in SWE-bench


@dataclass(frozen=True, slots=True)
class EvalResult:
    """What an evaluator returns for one (task, patch, answer). Never raised, always returned."""

    instance_id: str
    reward: float
    status: EvalStatus
    reason: str = ""
    tests: tuple[TestOutcome, ...] = ()
    patch_method: str = ""  # which apply strategy worked ("git apply", "git apply --3way", ...)
    restored_test_files: tuple[str, ...] = ()  # agent edits to test files that were reverted
    prewarm_s: float = 0.0  # time spent preparing the evaluation sandbox (overlaps the agent run)
    duration_s: float = 0.0  # time evaluate() itself took
    log: str = field(default="", repr=False)  # tail of the test run output
    infra_kind: str | None = None  # with status infra_failure: which operation failed
    tampering: tuple[str, ...] = ()  # what the guard caught (status "tampering")

    @property
    def resolved(self) -> bool:
        return self.status == "resolved"

    def counts(self) -> dict[str, int]:
        out = {"f2p_passed": 0, "f2p_total": 0, "p2p_passed": 0, "p2p_total": 0}
        for t in self.tests:
            key = "f2p" if t.kind == "FAIL_TO_PASS" else "p2p"
            out[f"{key}_total"] += 1
            out[f"{key}_passed"] += int(t.passed)
        return out

    def to_dict(self) -> dict:
        return {
            "instance_id": self.instance_id,
            "reward": self.reward,
            "status": self.status,
            "reason": self.reason,
            "patch_method": self.patch_method,
            "restored_test_files": list(self.restored_test_files),
            "tampering": list(self.tampering),
            "prewarm_s": round(self.prewarm_s, 3),
            "duration_s": round(self.duration_s, 3),
            "tests": [
                {"id": t.test_id, "kind": t.kind, "outcome": t.outcome, "detail": t.detail[-2000:]}
                for t in self.tests
            ],
        }
