"""Applying patches inside an evaluation sandbox, and keeping the agent's hands off the tests.

The agent's patch is tried with `git apply`, then `git apply --3way` (uses the blobs named in the
patch's index lines), then `git apply` with reduced context and whitespace tolerance, then GNU
`patch --fuzz` when the image has it. Afterwards every test file the agent touched is reverted to
the baseline (or deleted, if the agent created it) before the task's test patch goes in, so a patch
that edits the tests cannot make them pass. "Test file" means a file the test patch touches, a file
the test ids load, or test-run hooks such as conftest.py or a .pth file (see `protected_paths`).
The evaluator then writes the task's own copy of them over the result (trusted.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.workspace import BASELINE_TAG

PATCH_STRATEGIES: tuple[tuple[str, str], ...] = (
    ("git apply", "git apply --whitespace=nowarn {p}"),
    ("git apply --3way", "git apply --3way --whitespace=nowarn {p}"),
    ("git apply -C1 --recount", "git apply -C1 --recount --ignore-whitespace --whitespace=nowarn {p}"),
    ("patch --fuzz", "command -v patch >/dev/null && patch -p1 --batch --forward --fuzz=3 -i {p}"),
)

_DIFF_PATH = re.compile(r"^(?:\+\+\+|---) (?:[ab]/)?(\S+)", re.MULTILINE)
_GIT_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    ok: bool
    method: str
    error: str = ""


def patch_paths(patch: str) -> set[str]:
    """Every file path a unified / git diff touches (old and new names)."""
    paths = {p for pair in _GIT_HEADER.findall(patch) for p in pair}
    paths |= {p for p in _DIFF_PATH.findall(patch) if p != "/dev/null" and p != "dev/null"}
    return paths


def is_test_path(path: str) -> bool:
    """The usual Python test locations: tests/ or test/ dirs, test_*.py, *_test.py, conftest.py."""
    p = PurePosixPath(path)
    if any(part in ("tests", "test", "testing") for part in p.parts[:-1]):
        return True
    return p.name.startswith("test_") or p.name.endswith("_test.py") or p.name == "conftest.py"


# Files that configure or hook into the test run wherever they are; never part of a fix.
_TEST_INFRA = ("conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "sitecustomize.py", "usercustomize.py")
# Where a patch may never write: git's own files (config can run programs: fsmonitor, hooks) and the
# evaluation kit's folder.
_FORBIDDEN_DIRS = (".git", ".polar_eval")


def protected_paths(test_patch: str, test_ids: tuple[str, ...]) -> set[str]:
    """Paths the agent may not change: what the test patch touches and the files the test ids
    load (a pytest id's file; a unittest id's module and the packages' __init__.py on the way).

    Deliberately not every path that looks like a test: `django/test/` or `pkg/testing/` hold real
    source code a fix may need to touch.
    """
    paths = patch_paths(test_patch)
    for test_id in test_ids:
        if "::" in test_id or test_id.endswith(".py"):
            paths.add(test_id.split("::", 1)[0])
            continue
        parts = test_id.split(".")
        for k in range(1, len(parts) + 1):
            stem = "/".join(parts[:k])
            paths.update((f"{stem}.py", f"{stem}/__init__.py"))
    return paths


def must_restore(path: str, protected: set[str]) -> bool:
    name = PurePosixPath(path).name
    return path in protected or name in _TEST_INFRA or name.endswith(".pth")


def forbidden_paths(patch: str) -> list[str]:
    """Paths of the patch inside .git/ or the evaluation kit's folder."""
    return sorted(p for p in patch_paths(patch) if set(PurePosixPath(p).parts) & set(_FORBIDDEN_DIRS))


def apply_patch(sandbox: Sandbox, patch: str, *, name: str = "agent", timeout: float = 60.0) -> ApplyOutcome:
    """Apply a patch to the workspace, trying the strategies in order; report which one worked."""
    if not patch.endswith("\n"):
        patch += "\n"  # git apply rejects a last hunk without its newline ("corrupt patch")
    path = f".polar_eval/{name}.patch"
    sandbox.put_file(path, patch.encode())
    errors = []
    for method, template in PATCH_STRATEGIES:
        res = sandbox.exec(template.format(p=shlex.quote(path)), timeout=timeout)
        if res.exit_code == 0:
            return ApplyOutcome(True, method)
        errors.append(f"{method}: {(res.stderr or res.stdout).strip()[-600:]}")
        # A failed 3-way or fuzzy attempt can leave half-applied files or conflict markers behind.
        sandbox.exec("git checkout -q -f HEAD -- . && git clean -q -fd -e .polar_eval", timeout=timeout)
    return ApplyOutcome(False, "", "\n".join(errors))


def changed_paths(sandbox: Sandbox, timeout: float = 60.0) -> list[str]:
    """Files that differ from the baseline: modified, deleted and untracked."""
    res = sandbox.exec(
        f"git add -A -N . >/dev/null 2>&1; git diff --name-only {BASELINE_TAG} -- . ':(exclude).polar_eval'",
        timeout=timeout,
    )
    return [line for line in res.stdout.splitlines() if line.strip()]


def restore_test_files(sandbox: Sandbox, protected: set[str], timeout: float = 60.0) -> tuple[str, ...]:
    """Revert agent changes to protected files and test infrastructure; return the paths reverted."""
    touched = [p for p in changed_paths(sandbox, timeout) if must_restore(p, protected)]
    for path in touched:
        q = shlex.quote(path)
        # In the baseline: restore it. Not in the baseline: the agent added it, remove it.
        sandbox.exec(
            f"git reset -q -- {q} 2>/dev/null; "
            f"if git cat-file -e {BASELINE_TAG}:{q} 2>/dev/null; then git checkout -q {BASELINE_TAG} -- {q}; "
            f"else rm -rf -- {q}; fi",
            timeout=timeout,
        )
    return tuple(touched)
