"""SandboxEvaluator on the local backend: rewards come from real test runs in a fresh sandbox,
and every way an agent's patch can be empty, broken, slow or tampering scores 0 with its reason."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from polar_pl.tasks.evaluator import SandboxEvaluator
from polar_pl.tasks.patching import must_restore, protected_paths
from polar_pl.tasks.workspace import prepare_workspace
from polar_pl.testing.sandbox import OWNER, leftovers

# A patch that "fixes" strkit-1 by rewriting its tests instead of the code: the tests the task's
# test patch adds are replaced by ones that always pass.
TEST_EDITING_PATCH = """diff --git a/tests/test_slug.py b/tests/test_slug.py
--- a/tests/test_slug.py
+++ b/tests/test_slug.py
@@ -13,3 +13,11 @@ class SlugifyTests(unittest.TestCase):
 
     def test_custom_separator(self):
         self.assertEqual(slugify("a b c", sep="_"), "a_b_c")
+
+
+class SlugifyEdgeTests(unittest.TestCase):
+    def test_strips_leading_and_trailing(self):
+        pass
+
+    def test_strips_custom_separator(self):
+        pass
"""

# Shadowing the stdlib test runner from the repository root: `import unittest` would pick it up if
# the runner put the workspace first on sys.path.
SHADOW_UNITTEST_PATCH = """diff --git a/unittest.py b/unittest.py
new file mode 100644
--- /dev/null
+++ b/unittest.py
@@ -0,0 +1,3 @@
+import sys
+print("fake unittest: everything passed")
+sys.exit(0)
"""

# Hooking the test machinery from a test package's __init__ (reverted: the ids load it) ...
HOOK_FROM_TEST_PACKAGE_PATCH = """diff --git a/tests/__init__.py b/tests/__init__.py
--- a/tests/__init__.py
+++ b/tests/__init__.py
@@ -0,0 +1,3 @@
+import unittest
+
+unittest.TestCase.run = lambda self, result=None: result.addSuccess(self)
"""

# ... and from the code under test itself (kept, but the guard notices: tampering).
HOOK_FROM_SOURCE_PATCH = """diff --git a/strkit/__init__.py b/strkit/__init__.py
--- a/strkit/__init__.py
+++ b/strkit/__init__.py
@@ -1,5 +1,9 @@
 \"\"\"strkit: small text helpers.\"\"\"
 
+import unittest
+
+unittest.TestCase.run = lambda self, result=None: result.addSuccess(self)
+
 from strkit.case import to_snake
 from strkit.roman import from_roman, to_roman
 from strkit.slug import slugify
"""

INFINITE_LOOP_PATCH = '''diff --git a/strkit/slug.py b/strkit/slug.py
--- a/strkit/slug.py
+++ b/strkit/slug.py
@@ -9,4 +9,6 @@ _NON_ALNUM = re.compile(r"[^a-z0-9]+")
 def slugify(text, sep="-"):
     """Lowercase ASCII slug: runs of other characters become one separator."""
     text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
+    while text.startswith(" "):
+        pass
     return _NON_ALNUM.sub(sep, text.lower())
'''

# Half a fix: strips only "-", so the custom-separator test still fails.
HALF_FIX_PATCH = '''diff --git a/strkit/slug.py b/strkit/slug.py
--- a/strkit/slug.py
+++ b/strkit/slug.py
@@ -9,4 +9,4 @@ _NON_ALNUM = re.compile(r"[^a-z0-9]+")
 def slugify(text, sep="-"):
     """Lowercase ASCII slug: runs of other characters become one separator."""
     text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
-    return _NON_ALNUM.sub(sep, text.lower())
+    return _NON_ALNUM.sub(sep, text.lower()).strip("-")
'''


@pytest.fixture
def evaluator(local_factory):
    ev = SandboxEvaluator(local_factory, per_test_timeout_s=5, timeout_s=120)
    yield ev
    ev.close()


def _leftovers() -> set[str]:
    return set(leftovers())  # this worker's sandboxes only: the other xdist worker's come and go


def test_reference_patch_resolves_with_per_test_results(evaluator, builtin_tasks):
    task = builtin_tasks["calc-2"]
    res = evaluator.evaluate(evaluator.prewarm(task), task.patch)
    assert res.status == "resolved" and res.reward == 1.0 and res.patch_method == "git apply"
    assert {t.test_id for t in res.tests} == set(task.fail_to_pass) | set(task.pass_to_pass)
    assert all(t.passed for t in res.tests)
    assert res.counts() == {"f2p_passed": 2, "f2p_total": 2, "p2p_passed": 11, "p2p_total": 11}
    assert res.prewarm_s > 0


def test_unpatched_repository_fails_f2p(evaluator, builtin_tasks):
    res = evaluator.run_unpatched(builtin_tasks["calc-2"])
    assert res.status == "unresolved" and res.reward == 0.0
    f2p = [t for t in res.tests if t.kind == "FAIL_TO_PASS"]
    assert f2p and all(t.outcome == "failed" for t in f2p)
    assert "AssertionError" in f2p[0].detail and "9 != 5" in f2p[0].detail


def test_empty_patch_scores_zero(evaluator, builtin_tasks):
    res = evaluator.evaluate(evaluator.prewarm(builtin_tasks["strkit-1"]), "  \n")
    assert (res.status, res.reward) == ("empty_patch", 0.0)
    assert "no changes" in res.reason


def test_garbage_patch_scores_zero_with_reason(evaluator, builtin_tasks):
    res = evaluator.evaluate(evaluator.prewarm(builtin_tasks["strkit-1"]), "this is not a diff\n@@ nope\n")
    assert (res.status, res.reward) == ("patch_failed", 0.0)
    assert "does not apply" in res.reason and "git apply" in res.reason


def test_patch_for_another_file_version_does_not_apply(evaluator, builtin_tasks):
    """Even the fuzzy strategies refuse a patch whose removed line is not in the file."""
    wrong = builtin_tasks["strkit-1"].patch.replace("-    return _NON_ALNUM.sub(sep, text.lower())",
                                                    "-    return _NON_ALNUM.sub(sep, text.upper())")  # fmt: skip
    res = evaluator.evaluate(evaluator.prewarm(builtin_tasks["strkit-1"]), wrong)
    assert res.status == "patch_failed" and res.reward == 0.0


def test_test_editing_patch_cannot_pass(evaluator, builtin_tasks):
    task = builtin_tasks["strkit-1"]
    res = evaluator.evaluate(evaluator.prewarm(task), TEST_EDITING_PATCH)
    assert res.reward == 0.0 and res.status == "unresolved"
    assert res.restored_test_files == ("tests/test_slug.py",)
    assert all(not t.passed for t in res.tests if t.kind == "FAIL_TO_PASS")


def test_real_fix_plus_test_edits_still_resolves(evaluator, builtin_tasks):
    task = builtin_tasks["strkit-1"]
    res = evaluator.evaluate(evaluator.prewarm(task), task.patch + TEST_EDITING_PATCH)
    assert res.status == "resolved" and res.restored_test_files == ("tests/test_slug.py",)


def test_shadowing_unittest_does_not_fool_the_runner(evaluator, builtin_tasks):
    res = evaluator.evaluate(evaluator.prewarm(builtin_tasks["strkit-1"]), SHADOW_UNITTEST_PATCH)
    assert res.reward == 0.0 and res.status == "unresolved"
    assert all(t.outcome == "failed" for t in res.tests if t.kind == "FAIL_TO_PASS")


def test_hooking_unittest_from_the_test_package_is_reverted(evaluator, builtin_tasks):
    res = evaluator.evaluate(evaluator.prewarm(builtin_tasks["strkit-1"]), HOOK_FROM_TEST_PACKAGE_PATCH)
    assert res.reward == 0.0 and res.restored_test_files == ("tests/__init__.py",)
    assert all(t.outcome == "failed" for t in res.tests if t.kind == "FAIL_TO_PASS")


def test_hooking_unittest_from_the_source_is_caught(evaluator, builtin_tasks):
    """Even with the real fix in the patch: replacing the test machinery is tampering, reward 0."""
    task = builtin_tasks["strkit-1"]
    res = evaluator.evaluate(evaluator.prewarm(task), task.patch + HOOK_FROM_SOURCE_PATCH)
    assert res.reward == 0.0 and res.restored_test_files == ()
    assert res.status == "tampering" and res.reason.startswith("tampering: ")
    assert "test machinery replaced: unittest.case:TestCase.run" in res.tampering


def test_protected_paths():
    ids = ("tests.test_slug.SlugifyTests.test_simple", "tests/test_core.py::test_area[1]")
    test_patch = (
        "diff --git a/tests/test_new.py b/tests/test_new.py\n--- /dev/null\n+++ b/tests/test_new.py\n"
    )
    paths = protected_paths(test_patch, ids)
    assert {"tests/__init__.py", "tests/test_slug.py", "tests/test_core.py", "tests/test_new.py"} <= paths
    assert must_restore("pkg/sub/conftest.py", paths) and must_restore("sitecustomize.py", paths)
    # Real source in test-looking folders stays the agent's to change.
    assert not must_restore("django/test/utils.py", paths) and not must_restore(
        "pkg/testing/helpers.py", paths
    )


def test_fuzzy_fallback_applies_a_drifted_patch(evaluator, builtin_tasks):
    """A patch whose outer context and line numbers drifted (and without index lines, so no 3-way
    merge) still applies through the reduced-context / fuzz strategies."""
    task = builtin_tasks["strkit-2"]
    drifted = "\n".join(line for line in task.patch.splitlines() if not line.startswith("index "))
    drifted = drifted.replace("@@ -13,7 +13,7 @@", "@@ -20,7 +20,7 @@")
    drifted = drifted.replace(" for word in text.split():", " for word in text.split(' '):") + "\n"
    res = evaluator.evaluate(evaluator.prewarm(task), drifted)
    assert res.status == "resolved", res.reason
    assert res.patch_method in ("git apply -C1 --recount", "patch --fuzz")


def test_partial_credit(local_factory, builtin_tasks):
    task = builtin_tasks["strkit-1"]
    partial = SandboxEvaluator(local_factory, reward="partial")
    binary = SandboxEvaluator(local_factory, reward="binary")
    try:
        p = partial.evaluate(partial.prewarm(task), HALF_FIX_PATCH)
        b = binary.evaluate(binary.prewarm(task), HALF_FIX_PATCH)
    finally:
        partial.close()
        binary.close()
    assert p.status == b.status == "unresolved"
    assert p.reward == pytest.approx(0.5) and b.reward == 0.0
    with pytest.raises(ValueError, match="evaluator.reward"):
        SandboxEvaluator(local_factory, reward="sometimes")


def test_hanging_test_times_out_per_test(local_factory, builtin_tasks):
    ev = SandboxEvaluator(local_factory, per_test_timeout_s=1, timeout_s=120)
    try:
        res = ev.evaluate_task(builtin_tasks["strkit-1"], INFINITE_LOOP_PATCH)
    finally:
        ev.close()
    assert res.reward == 0.0 and res.status == "unresolved"
    assert "timeout" in {t.outcome for t in res.tests}


def test_evaluator_timeout_is_a_recorded_result(local_factory, builtin_tasks):
    ev = SandboxEvaluator(local_factory, per_test_timeout_s=60, timeout_s=3)
    try:
        t0 = time.monotonic()
        res = ev.evaluate_task(builtin_tasks["strkit-1"], INFINITE_LOOP_PATCH)
    finally:
        ev.close()
    assert res.status == "timeout" and res.reward == 0.0 and "exceeded" in res.reason
    assert time.monotonic() - t0 < 60


def test_prewarm_returns_at_once_and_overlaps(evaluator, builtin_tasks):
    task = builtin_tasks["datekit-6"]
    t0 = time.monotonic()
    handle = evaluator.prewarm(task)
    assert time.monotonic() - t0 < 0.5  # the sandbox starts in the background
    handle.future.result(timeout=60)  # ... and is ready before evaluate is called
    t1 = time.monotonic()
    res = evaluator.evaluate(handle, task.patch)
    assert res.resolved and res.prewarm_s > 0
    assert res.duration_s <= time.monotonic() - t1 + 0.01
    again = evaluator.evaluate(handle, task.patch)
    assert again.status == "error" and "already used" in again.reason


def test_discard_and_evaluate_leave_no_sandbox_behind(evaluator, builtin_tasks):
    before = _leftovers()
    task = builtin_tasks["graphkit-1"]
    evaluator.discard(evaluator.prewarm(task))
    evaluator.evaluate(evaluator.prewarm(task), task.patch)
    evaluator.evaluate(evaluator.prewarm(task), "garbage")
    evaluator.close()
    assert _leftovers() <= before


def test_a_discarded_preparation_is_gone_when_discard_returns(builtin_tasks, tmp_path):
    """A rollout's cleanup discards its evaluation handle while the sandbox may still be starting
    (under load: seconds). The sandbox must be gone when discard returns, not whenever the
    preparation finishes: the rollouts' close promises every sandbox stopped, and a run that
    exits right after left two workspaces behind (seen in CI)."""
    from polar_pl.sandbox.local import LocalSandbox

    started = threading.Event()

    class SlowStart(LocalSandbox):  # its workspace exists, the start is not done yet
        def start(self):
            out = super().start()
            started.set()
            time.sleep(1.0)
            return out

    root = tmp_path / "sbx"
    root.mkdir()
    ev = SandboxEvaluator(lambda: SlowStart(owner=OWNER, base_dir=str(root)), max_prewarm=1)
    try:
        task = builtin_tasks["graphkit-1"]
        running, queued = ev.prewarm(task), ev.prewarm(task)  # one pool thread: the second waits
        assert started.wait(10)
        ev.discard(queued)  # never started: cancelled, no sandbox
        ev.discard(running)  # starting now: waited for, then stopped
        assert list(root.iterdir()) == []
    finally:
        ev.close()


def test_preparation_failure_is_a_recorded_error(evaluator, builtin_tasks):
    broken = dataclasses.replace(builtin_tasks["calc-1"], repo_path="/nonexistent/calc")
    res = evaluator.evaluate(evaluator.prewarm(broken), broken.patch)
    assert res.status == "error" and res.reward == 0.0 and "/nonexistent/calc" in res.reason


def test_agent_sandbox_diff_round_trip(local_factory, evaluator, builtin_tasks):
    """prepare -> the agent edits files in its own sandbox -> Sandbox.diff() is the patch -> the
    evaluator scores it in a different, fresh sandbox (the agent's sandbox is never used)."""
    task = builtin_tasks["confini-1"]
    agent = local_factory()
    agent.start()
    try:
        prepare_workspace(task, agent)
        assert agent.diff() == ""  # the snapshot is the baseline
        assert agent.exec("git log --oneline | wc -l").stdout.strip() == "1"  # a checkout for the agent
        src = agent.get_file("confini/parser.py").decode()
        fixed = src.replace('        parts = line.split("=")\n        key, value = parts[0].strip(), parts[1]\n',
                            '        key, value = line.split("=", 1)\n        key = key.strip()\n')  # fmt: skip
        agent.put_file("confini/parser.py", fixed.encode())
        agent.put_file(".polar/answer.txt", b"fixed it")  # harness state is not part of the patch
        patch = agent.diff()
        handle = evaluator.prewarm(task)
        sandbox_used_for_eval = handle.future.result(timeout=60)[0]
        assert sandbox_used_for_eval.workdir != agent.workdir
        res = evaluator.evaluate(handle, patch, "fixed it")
    finally:
        agent.stop()
    assert "confini/parser.py" in patch and ".polar" not in patch
    assert res.status == "resolved", res.reason


@pytest.mark.slow
def test_docker_backend_scores_bad_patches_zero(docker_factory, builtin_tasks):
    """The same guarantees in containers: only the real fix scores, test edits are reverted."""
    task = builtin_tasks["strkit-1"]
    ev = SandboxEvaluator(docker_factory, per_test_timeout_s=10, timeout_s=120)
    try:
        handles = {name: ev.prewarm(task) for name in ("ref", "empty", "garbage", "tests", "shadow")}
        got = {
            "ref": ev.evaluate(handles["ref"], task.patch),
            "empty": ev.evaluate(handles["empty"], ""),
            "garbage": ev.evaluate(handles["garbage"], "not a patch\n"),
            "tests": ev.evaluate(handles["tests"], TEST_EDITING_PATCH),
            "shadow": ev.evaluate(handles["shadow"], SHADOW_UNITTEST_PATCH),
        }
    finally:
        ev.close()
    assert {k: (r.status, r.reward) for k, r in got.items()} == {
        "ref": ("resolved", 1.0),
        "empty": ("empty_patch", 0.0),
        "garbage": ("patch_failed", 0.0),
        "tests": ("unresolved", 0.0),
        "shadow": ("unresolved", 0.0),
    }
    assert got["tests"].restored_test_files == ("tests/test_slug.py",)
