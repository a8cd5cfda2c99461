"""`polar-pl tasks` through the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from polar_pl.tasks.evaluator import SandboxEvaluator
from polar_pl.tasks.sources import BuiltinTaskSource, SWEBenchTaskSource

POLAR = shutil.which("polar-pl") or str(Path(sys.executable).with_name("polar-pl"))


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [POLAR, "tasks", *args], check=False, capture_output=True, text=True, timeout=timeout
    )


def test_list_shows_every_builtin_task():
    res = _run("list")
    assert res.returncode == 0, res.stderr
    for task in BuiltinTaskSource().tasks():
        assert task.instance_id in res.stdout
    assert "24 tasks" in res.stdout or f"{len(BuiltinTaskSource().tasks())} tasks" in res.stdout


def test_check_prints_table_and_json(tmp_path):
    out = tmp_path / "check.json"
    res = _run("check", "--ids", "strkit-5", "calc-4", "--json", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "strkit-5" in res.stdout and "calc-4" in res.stdout and "2/2 tasks ok" in res.stdout
    rows = json.loads(out.read_text())
    assert [r["instance_id"] for r in rows] == ["calc-4", "strkit-5"]  # source order
    assert all(r["ok"] and r["reference"]["status"] == "resolved" for r in rows)
    assert all(r["unpatched"]["status"] == "unresolved" for r in rows)


def test_export_round_trips_as_swebench_jsonl(tmp_path, local_factory):
    out = tmp_path / "suite.jsonl"
    assert _run("export", "--out", str(out), "--difficulty", "hard").returncode == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(isinstance(r["FAIL_TO_PASS"], str) for r in rows)  # SWE-bench's encoding
    tasks = SWEBenchTaskSource(str(out)).tasks()
    assert {t.instance_id for t in tasks} == {
        t.instance_id for t in BuiltinTaskSource(difficulty="hard").tasks()
    }
    ev = SandboxEvaluator(local_factory)
    try:
        task = next(t for t in tasks if t.instance_id == "graphkit-2")
        assert ev.evaluate_task(task, task.patch).resolved
    finally:
        ev.close()


def test_bad_input_gets_a_message_not_a_traceback(tmp_path):
    res = _run("list", "--source", "swebench")
    assert res.returncode == 2 and "--data-files" in res.stdout and "Traceback" not in res.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"instance_id": "b-1", "repo": "o/r", "base_commit": "c",
                               "problem_statement": "p", "FAIL_TO_PASS": "oops"}) + "\n")  # fmt: skip
    res = _run("list", "--source", "swebench", "--data-files", str(bad))
    assert res.returncode == 2 and "'b-1'" in res.stdout and "FAIL_TO_PASS" in res.stdout
    assert "Traceback" not in res.stderr
    res = _run("check", "--source", "learnable")
    assert res.returncode == 2 and "no reference patch" in res.stdout
