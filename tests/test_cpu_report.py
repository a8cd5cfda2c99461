"""tests/cpu_report.py (`pytest --cpu-report FILE`): on a suite made here (pytester), a test that
burns CPU in a child process it waits for is charged that CPU, an idle one is not, and the
summary sums them per file."""

from __future__ import annotations

import json
import os

import cpu_report

pytest_plugins = ["pytester"]

SUITE = """
import subprocess, sys

def test_child_burns():
    code = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_idle():
    pass
"""


def test_each_test_is_charged_its_own_and_its_childrens_cpu(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(cpu_report.__file__))
    pytester.makeconftest("from cpu_report import pytest_addoption, pytest_runtest_protocol  # noqa: F401\n")
    pytester.makepyfile(test_burn=SUITE)
    report = tmp_path / "cpu.jsonl"
    pytester.runpytest_subprocess("--cpu-report", str(report)).assert_outcomes(passed=2)
    rows = {r["test"]: r for r in map(json.loads, report.read_text().splitlines())}
    assert set(rows) == {"test_burn.py::test_child_burns", "test_burn.py::test_idle"}
    assert rows["test_burn.py::test_child_burns"]["cpu_s"] >= 1.0
    assert rows["test_burn.py::test_idle"]["cpu_s"] < 0.5
    text = cpu_report.summary(report)
    assert text.startswith("2 tests,") and "test_burn.py" in text.splitlines()[1]
