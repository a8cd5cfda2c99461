"""The task's own copy of its test files, built on the host (never read back from a sandbox).

The snapshot at base_commit plus the task's test patch, applied on the host: the files the test
patch touches, the files the test ids load, the other Python files of test folders that hold those
(helpers the tests import), every conftest.py of the snapshot, and for pytest tasks
the snapshot's pytest configuration (copied under .polar_eval/cfg/, passed to pytest with `-c`, so
that test settings in the agent's pytest.ini / setup.cfg / tox.ini / pyproject.toml are never read).
The evaluator writes these bytes into the sandbox right before the run and the supervisor checks
them by hash before every test process.
"""

from __future__ import annotations

import configparser
import subprocess
import tempfile
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from polar_pl.tasks.patching import protected_paths
from polar_pl.tasks.task import Task
from polar_pl.tasks.testrun import CONFIG_DIR
from polar_pl.tasks.workspace import PrepareError, materialize_snapshot

# Where pytest looks for its settings in a rootdir, in its own order, and the section it needs.
_PYTEST_CONFIGS = (
    ("pytest.ini", "pytest"),
    (".pytest.ini", "pytest"),
    ("pyproject.toml", "tool.pytest.ini_options"),
    ("tox.ini", "pytest"),
    ("setup.cfg", "tool:pytest"),
)


def trusted_files(task: Task) -> dict[str, bytes]:
    """Relative path -> bytes of every file the evaluation must take from the task, not the agent."""
    with tempfile.TemporaryDirectory(prefix="polar-trusted-") as tmp:
        root = Path(tmp) / "repo"
        materialize_snapshot(task, root)
        if task.test_patch.strip():
            patch = task.test_patch if task.test_patch.endswith("\n") else task.test_patch + "\n"
            res = subprocess.run(
                ["git", "apply", "--whitespace=nowarn", "-"],
                cwd=root,
                input=patch.encode(),
                capture_output=True,
                check=False,
            )
            if res.returncode != 0:
                raise PrepareError(
                    f"task {task.instance_id!r}: the task's test patch does not apply: "
                    f"{res.stderr.decode(errors='replace').strip()[-600:]}"
                )
        wanted = protected_paths(task.test_patch, task.test_ids)
        wanted |= {str(p.relative_to(root)) for p in root.rglob("conftest.py")}
        wanted |= _test_folder_helpers(root, wanted)
        out = {rel: (root / rel).read_bytes() for rel in sorted(wanted) if (root / rel).is_file()}
        if task.test_runner == "pytest":
            name, data = pytest_config(root)
            out[f"{CONFIG_DIR}/{name}"] = data
        return out


def _test_folder_helpers(root: Path, wanted: set[str]) -> set[str]:
    """The .py files next to protected ones in folders named tests / test / testing."""
    folders = {PurePosixPath(p).parent for p in wanted}
    folders = {f for f in folders if f.name in ("tests", "test", "testing") and (root / f).is_dir()}
    return {str(f / p.name) for f in folders for p in (root / f).glob("*.py")}


def pytest_config(root: Path) -> tuple[str, bytes]:
    """(file name, bytes) of the snapshot's pytest settings; an empty pytest.ini when it has none."""
    for name, section in _PYTEST_CONFIGS:
        path = root / name
        if path.is_file() and _has_section(path, section):
            return name, path.read_bytes()
    return "pytest.ini", b"[pytest]\n"


def _has_section(path: Path, section: str) -> bool:
    text = path.read_text(errors="replace")
    if path.suffix == ".toml":
        try:
            node: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return False
        for key in section.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        return isinstance(node, dict)
    if path.name in ("pytest.ini", ".pytest.ini"):
        return True
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return False
    return parser.has_section(section)
