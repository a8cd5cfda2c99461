"""The pytest bundle for sandboxes without pytest: test processes load its modules compiled, and
fall back to its sources where the interpreter's magic number differs."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from polar_pl.tasks import inside
from polar_pl.tasks.pytest_bundle import PREFIX, bundle

INSIDE = Path(inside.__file__).parent
# A test process's start, as runner.load_pytest does it: the bundle on sys.meta_path, then pytest
# imported and run; an audit hook counts the bundle's modules compiled from source on the way.
CHILD = f"""
import sys
compiled = []
sys.addaudithook(lambda e, a: e == "compile" and str(a[1]).startswith({PREFIX!r}) and compiled.append(a[1]))
sys.path.insert(0, {str(INSIDE)!r})
import guard
sys.modules["polar_guard"] = guard
import runner
assert runner.BUNDLE_PREFIX == {PREFIX!r}
sys.meta_path.insert(0, runner.VerifiedFinder(runner.ZipFiles(open(sys.argv[1], "rb").read()), runner.BUNDLE_PREFIX))
import pytest, _pytest.main
assert pytest.__file__ == {PREFIX!r} + "pytest/__init__.py", pytest.__file__
assert _pytest.main.wrap_session.__code__.co_filename == _pytest.main.__file__
code = pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[2]])
print("compiled", len(compiled), "exit", int(code))
"""


def _run(tmp_path: Path, data: bytes) -> str:
    (tmp_path / "bundle.zip").write_bytes(data)
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    out = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, str(tmp_path / "bundle.zip"), str(tmp_path / "test_one.py")],
        cwd=tmp_path, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def _with_magic(data: bytes, magic: bytes) -> bytes:
    """The bundle with every compiled entry's magic number replaced (another interpreter's)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            body = src.read(info)
            dst.writestr(info, magic + body[4:] if info.filename.endswith(".pyc") else body)
    return out.getvalue()


@pytest.mark.parametrize("compiled", [True, False], ids=["same-interpreter", "other-magic-number"])
def test_a_test_process_runs_pytest_from_the_bundle(tmp_path, compiled):
    data = bundle() if compiled else _with_magic(bundle(), b"\x00\x00\r\n")
    assert importlib.util.MAGIC_NUMBER != b"\x00\x00\r\n"
    summary = _run(tmp_path, data)
    count = int(summary.split()[1])
    assert summary.endswith("exit 0"), summary
    assert count == 0 if compiled else count > 50, summary  # a pytest run imports ~120 of them
