"""The task's own copy of its test files, built on the host: what it holds and what it leaves to the
agent (fast, no sandbox)."""

from __future__ import annotations

import pytest

from polar_pl.tasks.task import task_from_row
from polar_pl.tasks.trusted import trusted_files
from polar_pl.tasks.workspace import PrepareError

TEST_PATCH = """diff --git a/tests/test_a.py b/tests/test_a.py
--- a/tests/test_a.py
+++ b/tests/test_a.py
@@ -1 +1,4 @@
 from pkg.mod import f
+
+def test_new():
+    assert f() == 2
"""


@pytest.fixture
def repo(tmp_path):
    for rel, text in {
        "pkg/__init__.py": "",
        "pkg/mod.py": "def f():\n    return 1\n",
        "pkg/testing/util.py": "X = 1\n",  # source in a test-looking folder the ids never load
        "tests/__init__.py": "",
        "tests/test_a.py": "from pkg.mod import f\n",
        "tests/helpers.py": "def check(x):\n    assert x\n",
        "tests/data/conftest.py": "",
        "pyproject.toml": "[project]\nname = 'pkg'\n\n[tool.pytest.ini_options]\naddopts = '-q'\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def _task(repo, runner="pytest", test_patch=TEST_PATCH):
    return task_from_row({
        "instance_id": "t-1", "repo": "o/pkg", "base_commit": "x", "problem_statement": "f returns 1",
        "test_patch": test_patch, "FAIL_TO_PASS": ["tests/test_a.py::test_new"], "test_runner": runner,
        "repo_path": str(repo),
    })  # fmt: skip


def test_trusted_files_hold_the_tests_their_helpers_and_the_pytest_config(repo):
    got = trusted_files(_task(repo))
    assert set(got) == {
        "tests/__init__.py", "tests/test_a.py", "tests/helpers.py", "tests/data/conftest.py",
        ".polar_eval/cfg/pyproject.toml",
    }  # fmt: skip
    assert b"def test_new" in got["tests/test_a.py"]  # the test patch applied
    assert b"[tool.pytest.ini_options]" in got[".polar_eval/cfg/pyproject.toml"]


def test_unittest_tasks_get_no_pytest_config_and_a_broken_test_patch_is_a_task_error(repo):
    (repo / "pyproject.toml").unlink()
    assert ".polar_eval/cfg/pytest.ini" in trusted_files(_task(repo))  # pytest without settings
    assert not any(p.startswith(".polar_eval") for p in trusted_files(_task(repo, runner="unittest")))
    with pytest.raises(PrepareError, match="test patch does not apply"):
        trusted_files(_task(repo, test_patch=TEST_PATCH.replace("from pkg.mod", "from other")))
