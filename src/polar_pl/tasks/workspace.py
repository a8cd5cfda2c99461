"""Putting a task's repository into a sandbox: the "prepare" step for agent and evaluation sandboxes.

The snapshot is materialised on the host (a copy of a plain directory, or `git archive` of
`base_commit` from a local git repository), copied in with `put_archive`, the task's setup commands
run, and the result becomes the baseline twice over: the sandbox's own diff baseline
(`Sandbox.baseline()`, kept outside the workspace) and a git repository in the workspace with tag
`polar-baseline`, which agents may use like any checkout and the evaluator uses to apply patches
and restore test files.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.task import Task

BASELINE_TAG = "polar-baseline"
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".git", ".polar", ".polar_eval")

# Idempotent: a backend may already have initialised git in the workspace.
_BASELINE_SCRIPT = f"""set -e
git init -q . >/dev/null 2>&1 || true
git config user.email polar@localhost
git config user.name polar
git config commit.gpgsign false
git add -A
git commit -q --allow-empty --no-verify -m 'polar baseline'
git tag -f {BASELINE_TAG} >/dev/null
"""


class PrepareError(RuntimeError):
    """The workspace could not be prepared (snapshot missing, setup command failed)."""


def snapshot_digest(root: Path) -> str:
    """A stable content hash of a plain snapshot directory (stands in for base_commit)."""
    h = hashlib.sha1()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part in ("__pycache__", ".git") for part in rel.parts):
            h.update(str(rel).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def materialize_snapshot(task: Task, dest: Path) -> None:
    """Write the task's repository at base_commit into the (empty or absent) host directory dest."""
    if task.repo_path is None:
        if task.scored_by_answer:
            dest.mkdir(parents=True, exist_ok=True)
            return
        raise PrepareError(f"task {task.instance_id!r}: no repo_path, so no repository snapshot to copy")
    src = Path(task.repo_path)
    if not src.exists():
        raise PrepareError(f"task {task.instance_id!r}: repo_path {src} does not exist")
    if _is_git_repo(src) and task.base_commit:
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(src), "archive", "--format=tar", task.base_commit],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise PrepareError(
                f"task {task.instance_id!r}: git archive {task.base_commit} in {src} failed: "
                f"{archive.stderr.decode(errors='replace').strip()}"
            )
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    else:
        shutil.copytree(src, dest, ignore=_IGNORED, dirs_exist_ok=True)


def _is_git_repo(path: Path) -> bool:
    probe = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--git-dir"], capture_output=True, text=True, check=False
    )
    # A plain directory nested inside some other checkout is not the task's repository.
    return probe.returncode == 0 and Path(path, probe.stdout.strip()).resolve().parent == path.resolve()


def new_sandbox(factory, task: Task) -> Sandbox:
    """A fresh (not started) sandbox for `task`: from the task's own image when it has one, which
    only a backend whose factory says `per_task_images` (sandbox=docker) can do."""
    if task.image is None:
        return factory()
    if not getattr(factory, "per_task_images", False):
        raise PrepareError(
            f"task {task.instance_id!r} runs in its own image {task.image!r}: use sandbox=docker "
            f"(this sandbox backend, {getattr(factory, 'func', factory)!r}, has no images)"
        )
    owned = tuple(getattr(task, "owned_paths", ()))  # paths of the task format (Harbor's /logs, /tests)
    extra = {"owned_paths": owned} if owned else {}
    return factory(image=task.image, image_context=task.image_context, **extra)


def prepare_workspace(task: Task, sandbox: Sandbox, *, setup_timeout: float = 600.0) -> None:
    """Copy the snapshot into a started sandbox, run setup commands, and commit the baseline.
    A task whose image holds its repository (an image and no repo_path) gets no snapshot."""
    if task.repo_path is not None or task.image is None:
        with tempfile.TemporaryDirectory(prefix="polar-snap-") as tmp:
            snap = Path(tmp) / "repo"
            materialize_snapshot(task, snap)
            sandbox.put_archive(snap, sandbox.workdir)
    for cmd in task.setup_commands:
        res = sandbox.exec(cmd, timeout=setup_timeout)
        if res.exit_code != 0:
            raise PrepareError(
                f"task {task.instance_id!r}: setup command {cmd!r} exited {res.exit_code}"
                f"{' (timed out)' if res.timed_out else ''}: {(res.stderr or res.stdout)[-1500:]}"
            )
    res = sandbox.exec(_BASELINE_SCRIPT, timeout=120)
    if res.exit_code != 0:
        raise PrepareError(f"task {task.instance_id!r}: baseline commit failed: {res.stderr[-1500:]}")
    sandbox.baseline()
