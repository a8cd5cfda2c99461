"""Workspace baseline and diff, with git run inside the sandbox (so every backend shares it).

The baseline lives in its own git directory outside the workspace (`GIT_DIR`), so a task repository
with its own `.git` is never touched: its history, index and hooks stay as the harness found them.
New files count (everything is staged into the baseline repo's index before diffing); harness
state folders are excluded at any depth.
"""

from __future__ import annotations

import shlex

# Folders harnesses write their own state into; never part of the agent's patch.
HARNESS_STATE_DIRS: tuple[str, ...] = (
    ".claude",
    ".codex",
    ".qwen",
    ".gemini",
    ".pi",
    ".opencode",
    ".polar",
    ".cache",
    "node_modules/.cache",
    "__pycache__",
)

_GIT = (
    "git -c user.name=polar -c user.email=polar@localhost -c commit.gpgsign=false "
    "-c core.hooksPath=/dev/null -c core.autocrlf=false -c core.fileMode=true "
    "-c advice.addEmbeddedRepo=false -c 'safe.directory=*'"
)


def _pathspec(exclude: tuple[str, ...]) -> str:
    specs = ["."]
    for name in exclude:
        specs.append(f":(exclude,glob)**/{name}/**")
        specs.append(f":(exclude,glob)**/{name}")
    return " ".join(shlex.quote(s) for s in specs)


def _env(git_dir: str, workdir: str) -> str:
    return f"export GIT_DIR={shlex.quote(git_dir)} GIT_WORK_TREE={shlex.quote(workdir)}; "


def baseline_script(git_dir: str, workdir: str, exclude: tuple[str, ...] = HARNESS_STATE_DIRS) -> str:
    """Shell script: (re)create the baseline repo and commit the workspace as it is now."""
    q = shlex.quote
    return (
        f"set -e; rm -rf {q(git_dir)}; mkdir -p {q(git_dir)}; "
        + _env(git_dir, workdir)
        + f"cd {q(workdir)}; git init -q; "
        + f"{_GIT} add -A -- {_pathspec(exclude)} >/dev/null 2>&1 || true; "
        + f"{_GIT} commit -q --allow-empty --no-verify -m baseline >/dev/null; "
        + f"{_GIT} rev-parse HEAD"
    )


def diff_script(git_dir: str, workdir: str, exclude: tuple[str, ...] = HARNESS_STATE_DIRS) -> str:
    """Shell script printing a `git apply`-able patch of the workspace against the baseline."""
    q = shlex.quote
    return (
        "set -e; "
        + _env(git_dir, workdir)
        + f"cd {q(workdir)}; "
        + f"{_GIT} add -A -- {_pathspec(exclude)} >/dev/null 2>&1 || true; "
        + f"{_GIT} diff --cached --binary --no-color --no-ext-diff HEAD -- {_pathspec(exclude)}"
    )
