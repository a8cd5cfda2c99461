"""The built-in bug-fix suite: small Python projects with real bugs, shipped as package data.

Layout (all plain files, so a reviewer can read them):
- `repos/<project>/`: the repository snapshot at its base commit (bugs included), stdlib only,
  tests under `tests/` in unittest style (the Docker base image has only python3 and git). The
  same tests also run under pytest (`load_suite("pytest")`, node ids; pytest from the evaluator's
  bundle), so every task is checked under both runners.
- `tasks/<instance_id>/task.json`: the SWE-bench fields (problem statement as a user reported it,
  FAIL_TO_PASS / PASS_TO_PASS unittest ids, difficulty), `fix.patch` (the reference fix, SWE-bench's
  `patch`) and `test.patch` (the tests that show the bug, SWE-bench's `test_patch`).

To add a task: copy the project into a scratch git repository, add the failing tests, `git diff`
into test.patch, fix the bug, `git diff -- <source files>` into fix.patch, write task.json, and run
`polar-pl tasks check --ids <id>`: it proves the fix resolves the task and that the unpatched
repository fails FAIL_TO_PASS.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from polar_pl.tasks.task import Task, task_from_row
from polar_pl.tasks.workspace import snapshot_digest

ROOT = Path(str(resources.files("polar_pl.tasks.builtin")))


def load_suite(runner: str = "unittest") -> list[Task]:
    """Every built-in task, ordered by instance id; with runner="pytest" its ids are node ids."""
    digests: dict[str, str] = {}
    out = []
    for task_dir in sorted((ROOT / "tasks").iterdir()):
        meta_path = task_dir / "task.json"
        if not meta_path.is_file():
            continue
        row = json.loads(meta_path.read_text())
        project = row.pop("project")
        repo_dir = ROOT / "repos" / project
        if project not in digests:
            digests[project] = snapshot_digest(repo_dir)
        row |= {
            "base_commit": digests[project],
            "patch": (task_dir / "fix.patch").read_text(),
            "test_patch": (task_dir / "test.patch").read_text(),
            "repo_path": str(repo_dir),
            "test_runner": runner,
        }
        if runner == "pytest":
            row |= {key: [pytest_node_id(t) for t in row[key]] for key in ("FAIL_TO_PASS", "PASS_TO_PASS")}
        out.append(task_from_row(row, origin=str(meta_path)))
    return out


def pytest_node_id(unittest_id: str) -> str:
    """`tests.test_x.Case.test_y` -> `tests/test_x.py::Case::test_y` (the suite's ids are all
    module.Class.method)."""
    *module, cls, method = unittest_id.split(".")
    return f"{'/'.join(module)}.py::{cls}::{method}"
