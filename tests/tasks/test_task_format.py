"""Loading SWE-bench / SWE-Gym format task files through `datasets`, and the errors for bad ones."""

from __future__ import annotations

import json

import pytest

from polar_pl.tasks.sources import SWEBenchTaskSource
from polar_pl.tasks.task import TaskFormatError, task_from_row


def _row(iid: str, **over) -> dict:
    row = {
        "instance_id": iid,
        "repo": "octo/widgets",
        "base_commit": "0123456789abcdef0123456789abcdef01234567",
        "problem_statement": "Widgets explode when frobnicated.\n",
        "patch": "diff --git a/w.py b/w.py\n",
        "test_patch": "diff --git a/tests/test_w.py b/tests/test_w.py\n",
        # As SWE-bench ships them: JSON-encoded lists inside strings.
        "FAIL_TO_PASS": json.dumps(["tests/test_w.py::test_frob"]),
        "PASS_TO_PASS": json.dumps(["tests/test_w.py::test_make", "tests/test_w.py::test_size"]),
        "version": "1.2",
        "environment_setup_commit": "fedcba9876543210fedcba9876543210fedcba98",
        "created_at": "2023-05-01T10:00:00Z",
        "hints_text": "",
    }
    row.update(over)
    return row


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_swebench_jsonl_loads(tmp_path):
    files = _write_jsonl(tmp_path / "tasks.jsonl", [_row("octo__widgets-1"), _row("octo__widgets-2")])
    tasks = SWEBenchTaskSource(files, repos_dir=str(tmp_path / "repos")).tasks()
    assert [t.instance_id for t in tasks] == ["octo__widgets-1", "octo__widgets-2"]
    t = tasks[0]
    assert t.fail_to_pass == ("tests/test_w.py::test_frob",)
    assert t.pass_to_pass == ("tests/test_w.py::test_make", "tests/test_w.py::test_size")
    assert t.base_commit.startswith("0123")
    assert t.repo_path == str(tmp_path / "repos" / "octo__widgets")
    assert t.extra["version"] == "1.2"
    assert "Widgets explode" in t.prompt and "octo/widgets" in t.prompt


def test_swegym_real_lists_and_setup(tmp_path):
    row = _row(
        "gym-1",
        FAIL_TO_PASS=["tests.test_a.T.test_x"],
        PASS_TO_PASS=[],
        setup_commands=["python3 -m pip install -e ."],
        test_runner="unittest",
        repo_path="/srv/repos/gym",
    )
    (t,) = SWEBenchTaskSource(_write_jsonl(tmp_path / "gym.jsonl", [row])).tasks()
    assert t.fail_to_pass == ("tests.test_a.T.test_x",)
    assert t.pass_to_pass == ()
    assert t.setup_commands == ("python3 -m pip install -e .",)
    assert t.repo_path == "/srv/repos/gym"


def test_parquet_loads(tmp_path):
    import datasets

    path = tmp_path / "tasks.parquet"
    datasets.Dataset.from_list([_row("pq-1"), _row("pq-2")]).to_parquet(str(path))
    tasks = SWEBenchTaskSource(str(path)).tasks()
    assert [t.instance_id for t in tasks] == ["pq-1", "pq-2"]
    assert tasks[1].fail_to_pass == ("tests/test_w.py::test_frob",)


def test_filters(tmp_path):
    rows = [_row("a", difficulty="easy"), _row("b", difficulty="hard"), _row("c", difficulty="hard")]
    files = _write_jsonl(tmp_path / "t.jsonl", rows)
    assert [t.instance_id for t in SWEBenchTaskSource(files, difficulty="hard").tasks()] == ["b", "c"]
    assert [t.instance_id for t in SWEBenchTaskSource(files, instance_ids=["c"]).tasks()] == ["c"]
    assert [t.instance_id for t in SWEBenchTaskSource(files, limit=2).tasks()] == ["a", "b"]
    with pytest.raises(ValueError, match="unknown instance ids"):
        SWEBenchTaskSource(files, instance_ids=["zzz"]).tasks()


@pytest.mark.parametrize(
    ("bad_row", "field", "message"),
    [
        ({"FAIL_TO_PASS": "[not json"}, "FAIL_TO_PASS", "not a JSON list"),
        ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS", "is empty"),
        ({"PASS_TO_PASS": json.dumps([1, 2])}, "PASS_TO_PASS", "list of non-empty test id strings"),
        ({"problem_statement": ""}, "problem_statement", "is empty"),
        ({"test_runner": "nose"}, "test_runner", "allowed: unittest, pytest"),
        ({"difficulty": "impossible"}, "difficulty", "allowed: easy, medium, hard"),
    ],
)
def test_malformed_row_names_instance_and_field(tmp_path, bad_row, field, message):
    rows = [_row("ok-1"), _row("broken-7", **bad_row)]
    files = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TaskFormatError) as exc:
        SWEBenchTaskSource(files).tasks()
    assert exc.value.instance_id == "broken-7"
    assert exc.value.field_name == field
    assert "'broken-7'" in str(exc.value) and f"'{field}'" in str(exc.value) and message in str(exc.value)


def test_missing_field_names_instance_and_field(tmp_path):
    row = _row("nobase-3")
    del row["base_commit"]
    files = _write_jsonl(tmp_path / "bad.jsonl", [_row("ok-1"), row])
    with pytest.raises(TaskFormatError, match=r"task 'nobase-3'.*field 'base_commit' is missing"):
        SWEBenchTaskSource(files).tasks()


def test_column_type_mismatch_is_diagnosed(tmp_path):
    """datasets fails on a column that is a string in one row and a number in another; the error
    must still say which instance and field, not an arrow traceback."""
    files = _write_jsonl(tmp_path / "bad.jsonl", [_row("ok-1"), _row("typo-2", base_commit=12345)])
    with pytest.raises(TaskFormatError) as exc:
        SWEBenchTaskSource(files).tasks()
    assert exc.value.instance_id == "typo-2" and exc.value.field_name == "base_commit"


def test_invalid_json_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_row("ok-1")) + '\n{"instance_id": "cut-2", "repo\n')
    with pytest.raises(TaskFormatError, match=r"line 2.*not valid JSON"):
        SWEBenchTaskSource(str(path)).tasks()


def test_duplicate_instance_id(tmp_path):
    files = _write_jsonl(tmp_path / "dup.jsonl", [_row("same-1"), _row("same-1")])
    with pytest.raises(TaskFormatError, match="'same-1'.*'instance_id' is duplicated"):
        SWEBenchTaskSource(files).tasks()


def test_missing_file_and_bad_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SWEBenchTaskSource(str(tmp_path / "nope.jsonl")).tasks()
    with pytest.raises(ValueError, match="task.format"):
        SWEBenchTaskSource("x.csv", format="csv")


def test_answer_scored_row_needs_no_repository():
    t = task_from_row(
        {"instance_id": "ans-1", "problem_statement": "Say hi in caps.",
         "answer_check": {"kind": "uppercase_fraction", "params": {"min_letters": 2}}}
    )  # fmt: skip
    assert (
        t.scored_by_answer and t.prompt == "Say hi in caps." and t.answer_check.params == {"min_letters": 2}
    )
    with pytest.raises(TaskFormatError, match="answer_check"):
        task_from_row({"instance_id": "ans-2", "problem_statement": "x", "answer_check": {"params": {}}})
