"""The built-in suite checks itself in each sandbox backend and under both test runners: every
reference patch resolves its task, and every unpatched repository fails its FAIL_TO_PASS tests while
passing PASS_TO_PASS. (Docker runs the pytest runner in the adversarial suite, with the bundle.)"""

from __future__ import annotations

import collections
import json
import subprocess

import pytest

from polar_pl.tasks.evaluator import SandboxEvaluator
from polar_pl.tasks.patching import is_test_path, patch_paths
from polar_pl.tasks.sources import BuiltinTaskSource
from polar_pl.tasks.suite_check import check_suite


def test_suite_shape():
    tasks = BuiltinTaskSource().tasks()
    assert len(tasks) >= 20
    by_level = collections.Counter(t.difficulty for t in tasks)
    assert set(by_level) == {"easy", "medium", "hard"} and min(by_level.values()) >= 4
    for t in tasks:
        assert t.patch and t.test_patch and t.fail_to_pass and t.pass_to_pass
        assert len(t.problem_statement) > 80
        # The fix touches only source files, the test patch only tests: the split the evaluator
        # relies on when it reverts test edits.
        assert not any(is_test_path(p) for p in patch_paths(t.patch)), t.instance_id
        assert all(is_test_path(p) for p in patch_paths(t.test_patch)), t.instance_id
        assert not set(t.fail_to_pass) & set(t.pass_to_pass)
    assert len({t.instance_id for t in tasks}) == len(tasks)


def test_patches_apply_to_their_snapshots(tmp_path):
    """Fast drift guard (the slow self-checks below prove the rest): if a snapshot file is edited
    or reformatted, its patches stop applying and this says which."""
    from polar_pl.tasks.workspace import materialize_snapshot

    failures = []
    for t in BuiltinTaskSource().tasks():
        repo = tmp_path / t.instance_id
        materialize_snapshot(t, repo)
        for name, patch in (("fix", t.patch), ("test", t.test_patch)):
            res = subprocess.run(["git", "apply", "--check", "-"], cwd=repo, input=patch, text=True,
                                 capture_output=True, check=False)  # fmt: skip
            if res.returncode != 0:
                failures.append(f"{t.instance_id} {name}.patch: {res.stderr.strip()}")
    assert not failures, failures


def _check_all(factory, runner: str = "unittest") -> None:
    evaluator = SandboxEvaluator(factory, per_test_timeout_s=60, timeout_s=300)
    try:
        checks = check_suite(BuiltinTaskSource(runner=runner).tasks(), evaluator, workers=2)
    finally:
        evaluator.close()
    report = [
        {"id": c.task.instance_id, "difficulty": c.task.difficulty, "seconds": round(c.seconds, 2),
         "reference": c.reference.status, "problem": c.problem()}
        for c in checks
    ]  # fmt: skip
    print(json.dumps(report, indent=1))
    bad = [r for r in report if r["problem"]]
    assert not bad, bad


@pytest.mark.slow
def test_suite_self_check_local(local_factory):
    _check_all(local_factory)


@pytest.mark.slow
def test_suite_self_check_docker(docker_factory):
    _check_all(docker_factory)


@pytest.mark.slow
def test_suite_self_check_local_pytest(local_factory):
    """The same tasks under pytest (node ids, SWE-bench's log parser and grading): every reference
    fix resolves and every unpatched repository fails, as under unittest."""
    _check_all(local_factory, "pytest")
